"""What a test is follows from where it lives, and what it asks for is said by its markers.

tests/unit: recorded bundles, synthetic data, parsers, and profkit's command line on them. No
root, no process started but profkit itself; it runs anywhere, in seconds.
tests/live: everything that starts a process for profkit to look at, runs a program that reads
profkit's outputs (Chromium, Go's pprof, Prometheus, promtool, pip), or needs root. Each test
there is marked `live`, so that `-m "not live"` selects tests/unit.

`root` marks a test that needs root (cgroups, ptrace, perf, bcc, other users); it is skipped
where the tests do not run as root. A test under tests/unit marked `root` or `live` stops the
collection: it belongs in tests/live.

`make test` runs the tests in three lanes at once (scripts/test_lanes.sh), so that one lane's
waits (capture windows, watch intervals, scrapes) overlap the others' work:
- the capture lane: the captures that attach to recipes and assert where their CPU goes;
- the side lane, marked `side_lane` here: tests/unit, the watch agent's tests, the bad-input
  and hostile tests, and the captures of the CO-RE loader's and of CPython 3.14 and 3.15;
- the tools lane, marked `tools_lane`: the safety tests (signals, repeated attaches) and the
  live tests of what profkit does around its target and tools (many threads, mapped files and
  names, probe points, the interpreter tables, packaging, doctor, what it keeps for the next
  capture), and the serving recipe's captures. The consumers of its outputs (Chromium, pprof,
  speedscope) run in the capture lane.
The lanes load two cores fully, so no test may assume the machine to itself (a leftover check
looks at what its own tools or processes made: support.stale_uprobe_events, the serving
front's own segments), and a rate or share a test asserts must hold on a busy machine: a recipe
a test times is paced below what the machine can run (the switched-probes test), or runs ahead
of the other lanes (niceness -10). `LANES=2` runs the side and tools lanes' tests in one lane.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
UNIT = HERE / "unit"
LIVE = HERE / "live"
# The live test files of the side and tools lanes (see above); everything else under tests/live
# is the capture lane's.
SIDE_LANE = (
    "test_watch_",
    "test_bad_input.py",
    "test_hostile.py",
    "test_target_files.py",
    "test_core_loader.py",
    "test_new_pythons.py",
)
TOOLS_LANE = (
    "test_safety_live.py",
    "test_many_threads.py",
    "test_mapped_files.py",
    "test_target_names.py",
    "test_probe_points.py",
    "test_pyruntime.py",
    "test_packaging.py",
    "test_doctor.py",
    "test_targets.py",
    "test_proc_sampler.py",
    "test_native_stacks.py",
    "test_loaders_agree.py",
    "test_overhead_benchmark.py",
    "test_bootcache.py",
    "test_serving.py",
)


def lane(path: Path) -> str:
    if path.is_relative_to(UNIT) or path.name.startswith(SIDE_LANE):
        return "side"
    if path.name in TOOLS_LANE:
        return "tools"
    return "capture"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    named = [n for n in (*SIDE_LANE, *TOOLS_LANE) if n.endswith(".py")]
    gone = [name for name in named if not (LIVE / name).is_file()]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py's lanes name no such file: {gone}")
    misplaced = []
    for item in items:
        path = Path(item.path).resolve()
        where = lane(path)
        if where != "capture":
            item.add_marker(getattr(pytest.mark, f"{where}_lane"))
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
