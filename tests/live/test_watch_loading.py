"""`watch` with probes that take seconds to load: every target has series from the first
window, a stop is obeyed while probes load, and a target that execs is a new target."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..support import stale_uprobe_events
from ..watch_support import agent

pytestmark = pytest.mark.root

POOL = (
    "import sys, time, torch\n"
    "torch.set_num_threads(2)\n"
    "x = torch.ones(1 << 16)\n"
    "y = torch.empty_like(x)\n"
    "while True:\n"
    "    y.copy_(x)\n"
    "    time.sleep(0.01)\n"
)


def series_targets(metrics: str) -> set[str]:
    return set(
        re.findall(r'^profkit_process_cpu_seconds_total\{.*?target="([^"]+)"', metrics, re.M)
    )


def test_six_new_targets_have_series_from_the_first_window(tmp_path: Path) -> None:
    marker = f"six-targets-{time.time_ns()}"
    names = [f"pool{i}" for i in range(6)]
    processes = []
    for name in names:
        script = tmp_path / f"{name}.py"
        script.write_text(POOL)
        processes.append(subprocess.Popen([sys.executable, str(script), marker]))
    try:
        time.sleep(8)  # every target has imported torch and mapped its OpenMP runtime
        with agent("--match", marker, "--interval", "3") as a:
            a.wait_serving()
            started = time.monotonic()
            seen: set[str] = set()
            # One window is 3 s; loading six probes one after the other takes 6-15 s here,
            # which the windows no longer wait for.
            while time.monotonic() - started < 8 and seen != set(names):
                time.sleep(0.25)
                seen = series_targets(a.metrics())
            assert seen == set(names), (seen, a.output)
            code, took = a.terminate()  # while probes are still loading, most likely
        assert code == 0 and took < 5, (took, a.output)
        assert stale_uprobe_events() == []
        assert all(p.poll() is None for p in processes)
    finally:
        for p in processes:
            p.kill()
            p.wait(timeout=20)


EXECS = (
    "import os, sys, time\n"
    "time.sleep(float(sys.argv[2]))\n"
    "os.execv(sys.executable, [sys.executable, sys.argv[3], sys.argv[1], '60'])\n"
)


def test_a_target_that_execs_is_watched_as_the_new_program(tmp_path: Path) -> None:
    marker = f"exec-target-{time.time_ns()}"
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text(EXECS)
    second.write_text("import sys, time\ntime.sleep(float(sys.argv[2]))\n")
    process = subprocess.Popen([sys.executable, str(first), marker, "4", str(second)])
    try:
        with agent("--match", marker, "--interval", "1", "--no-probes") as a:
            a.wait_serving()
            deadline = time.monotonic() + 30
            seen: set[str] = set()
            live = ""
            while time.monotonic() < deadline and "second" not in seen:
                time.sleep(0.5)
                metrics = a.metrics()
                seen |= series_targets(metrics)
                found = re.search(r"^profkit_targets (\S+)", metrics, re.M)
                live = found.group(1) if found else ""
            assert {"first", "second"} <= seen, (seen, a.output)
            assert float(live) == 1.0, live
            assert "watching second" in a.output, a.output
            code, took = a.terminate()
        assert code == 0 and took < 5
    finally:
        process.kill()
        process.wait(timeout=20)
