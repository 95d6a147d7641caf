"""`watch` with probes that take seconds to load: every target has series from the first
window, a stop is obeyed while probes load, and a target that execs is a new target; pool CPU
comes from /proc whether a probe is loaded or not."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..support import stale_uprobe_events
from ..watch_support import AgentProcess, Readings, agent, interpolate, thread_cpu

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


# Imports torch after argv[1] seconds, then keeps its pool copying.
LATE_POOL = (
    "import sys, time\n"
    "time.sleep(float(sys.argv[1]))\n"
    "import torch\n"
    "torch.set_num_threads(2)\n"
    "x = torch.ones(1 << 22)\n"
    "y = torch.empty_like(x)\n"
    "while True:\n"
    "    y.copy_(x)\n"
)
POOL_CPU = re.compile(r"^profkit_pool_cpu_seconds_total\{.*\} (\S+) (\d+)$", re.M)


def worker_cpu(pid: int) -> float:
    """The truth: every thread's CPU but the main one's (here, the pool's workers)."""
    return sum(cpu for tid, cpu in thread_cpu(pid).items() if tid != pid)


def pool_samples(
    agents: list[AgentProcess], truths: list[Readings], burned: float, most: float
) -> list[list[tuple[float, float]]]:
    """Each agent's (stamp, value) of the pool CPU counter, each new stamp once, read until
    every truth has risen by `burned` CPU seconds (at least 8 s, at most `most` s): how much
    CPU a pool gets in a fixed time depends on what else this machine runs."""
    seen: list[dict[float, float]] = [{} for _ in agents]
    started = time.monotonic()
    first = [truth_now(t) for t in truths]

    def enough() -> bool:
        return all(truth_now(t) - f >= burned for t, f in zip(truths, first, strict=True))

    while time.monotonic() - started < 8 or (not enough() and time.monotonic() - started < most):
        for a, into in zip(agents, seen, strict=True):
            for value, stamp_ms in POOL_CPU.findall(a.metrics()):
                into[int(stamp_ms) / 1000] = float(value)
        time.sleep(0.25)
    return [sorted(into.items()) for into in seen]


def truth_now(truth: Readings) -> float:
    series = truth.series(float)
    return series[-1][1] if series else 0.0


def test_pool_cpu_comes_from_proc_without_probes() -> None:
    """--no-probes: pool CPU is the workers' CPU from /proc, for a target found with its pool
    running and for one found before it imported torch (its workers' CPU from their start)."""
    early = subprocess.Popen([sys.executable, "-c", LATE_POOL, "0"])
    late = subprocess.Popen([sys.executable, "-c", LATE_POOL, "4"])
    try:
        time.sleep(3)  # the early target's pool runs; the late one has not imported torch
        with (
            agent(
                "--pid", str(early.pid), "--name", "early", "--interval", "1", "--no-probes"
            ) as a,
            agent("--pid", str(late.pid), "--name", "late", "--interval", "1", "--no-probes") as b,
            Readings(lambda: worker_cpu(early.pid)) as early_truth,
            Readings(lambda: worker_cpu(late.pid)) as late_truth,
        ):
            a.wait_serving()
            b.wait_serving()
            time.sleep(4)  # the late target imports torch meanwhile
            early_series, late_series = pool_samples(
                [a, b], [early_truth, late_truth], burned=1.5, most=45
            )
            time.sleep(0.5)  # the truth's readings run past the last stamp
        for name, series, truth in (
            ("early", early_series, early_truth.series(float)),
            ("late", late_series, late_truth.series(float)),
        ):
            inside = [(t, v) for t, v in series if truth[0][0] <= t <= truth[-1][0]]
            assert len(inside) >= 6, (name, series)
            (t0, v0), (t1, v1) = inside[0], inside[-1]
            burned = interpolate(truth, t1) - interpolate(truth, t0)
            assert burned >= 1.0, f"{name}: its pool burned only {burned:.2f} s"
            assert abs((v1 - v0) - burned) <= 0.05 * burned, (name, v1 - v0, burned)
        # The late target's workers started after the agent's baseline: the counter holds all
        # of their CPU since they started.
        stamp, value = late_series[-1]
        total = interpolate(late_truth.series(float), stamp)
        assert abs(value - total) <= 0.05 * total, (value, total)
    finally:
        for process in (early, late):
            process.kill()
            process.wait(timeout=20)
