"""`watch` on live processes: a process found before it loads torch gets its probe once it does;
a target stays running and untouched."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from ..support import RECIPES, ROOT
from ..watch_support import agent

pytestmark = pytest.mark.root

LATE = (
    "import runpy, sys, time\n"
    "time.sleep(3)\n"
    f"sys.argv = [{str(RECIPES / 'shm_fanout.py')!r}]\n"
    f"runpy.run_path({str(RECIPES / 'shm_fanout.py')!r}, run_name='__main__')\n"
)


def test_probe_follows_a_runtime_loaded_late() -> None:
    marker = f"late-runtime-{time.time_ns()}"
    with agent("--match", marker, "--name", "late", "--interval", "0.5") as a:
        a.wait_serving()
        process = subprocess.Popen(
            [sys.executable, "-c", LATE, marker],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        try:
            deadline = time.monotonic() + 60
            regions = 0.0
            metrics = ""
            # Regions prove the probe; the first window with them may close before the pool's
            # CPU and its sites do.
            while time.monotonic() < deadline and (regions < 50 or "shm_fanout.py:" not in metrics):
                time.sleep(0.5)
                metrics = a.metrics()
                found = re.search(
                    r'^profkit_pool_regions_total\{.*target="late"\} (\S+)', metrics, re.M
                )
                regions = float(found.group(1)) if found else 0.0
            assert regions >= 50, a.output + metrics
            # (The coverage counters say whether the walker read stacks that did not resolve,
            # or read none, and why: profkit_walker_regions_without_stack_total.)
            assert 'site="' in metrics and "shm_fanout.py:" in metrics, a.output + metrics
            assert process.poll() is None
        finally:
            process.terminate()
            process.wait(timeout=20)
        code, took = a.terminate()
    assert code == 0 and took < 5, a.output
    assert "region probe once it loads an OpenMP runtime" in a.output, a.output
