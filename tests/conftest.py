"""What a test is follows from where it lives, and what it asks for is said by its markers.

tests/unit: recorded bundles, synthetic data, parsers, and profkit's command line on them. No
root, no process started but profkit itself; it runs anywhere, in seconds.
tests/live: everything that starts a process for profkit to look at, runs a program that reads
profkit's outputs (Chromium, Go's pprof, Prometheus, promtool, pip), or needs root. Each test
there is marked `live`, so that `-m "not live"` selects tests/unit.

`root` marks a test that needs root (cgroups, ptrace, perf, bcc, other users); it is skipped
where the tests do not run as root. A test under tests/unit marked `root` or `live` stops the
collection: it belongs in tests/live.

`make test` runs the tests in two lanes at once (scripts/test_lanes.sh), so that one lane's
waits (capture windows, watch intervals, scrapes) overlap the other's work: the side lane, marked
`side_lane` here, holds tests/unit, the watch agent's tests and the bad-input and hostile tests;
the capture lane holds the rest of tests/live, which attaches captures to recipes. Either lane's
tests run beside the other's, so no test may assume the machine to itself (a leftover check looks
at what its own tools made: support.stale_uprobe_events).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
UNIT = HERE / "unit"
LIVE = HERE / "live"
# The live test files of the side lane (see above); everything else under tests/live is the
# capture lane's.
SIDE_LANE = ("test_watch_", "test_bad_input.py", "test_hostile.py", "test_target_files.py")


def lane(path: Path) -> str:
    if path.is_relative_to(UNIT) or path.name.startswith(SIDE_LANE):
        return "side"
    return "capture"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        path = Path(item.path).resolve()
        if lane(path) == "side":
            item.add_marker(pytest.mark.side_lane)
        if path.is_relative_to(LIVE):
            item.add_marker(pytest.mark.live)
        elif path.is_relative_to(UNIT):
            asked = [name for name in ("root", "live") if item.get_closest_marker(name)]
            if asked:
                misplaced.append(f"{item.nodeid} (marked {', '.join(asked)})")
    if misplaced:
        raise pytest.UsageError(
            "tests under tests/unit may need neither root nor real processes; move these to "
            "tests/live:\n  " + "\n  ".join(misplaced)
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root (cgroups, ptrace, perf, bcc, other users)")
