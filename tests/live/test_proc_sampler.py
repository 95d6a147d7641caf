"""The /proc sampler on a process whose threads come and go: every thread is seen while it
lives, an exited one costs no descriptor, and the window's totals hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from profkit.capture.clock import monotonic_ns
from profkit.capture.collectors.base import CaptureContext
from profkit.capture.collectors.procstat import ProcCollector
from profkit.host.target import inspect

# Each new thread spins for 0.3 s; a new one starts every 0.1 s, so 3-4 live at once and the
# count changes between full samples as well as staying level while one replaces another.
CHURN = """
import threading, time
def spin(until):
    while time.monotonic() < until:
        pass
print("ready", flush=True)
while True:
    threading.Thread(target=spin, args=(time.monotonic() + 0.3,)).start()
    time.sleep(0.1)
"""


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_threads_that_come_and_go_are_followed(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHURN], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        collector = ProcCollector(interval_s=0.1)
        context = CaptureContext(
            target=inspect(child.pid),
            directory=tmp_path,
            rate_hz=1,
            duration_s=4,
            clock=monotonic_ns,
        )
        before = _open_fds()
        collector.start(context)
        collector.thread_interval_s, collector._full_every = 0.5, 5  # two full samples a second
        time.sleep(4)
        during = _open_fds() - before
        result = collector.stop()
    finally:
        child.kill()
        child.wait()
    assert result.status == "ok", result.reason
    assert _open_fds() == before, "every descriptor is closed at the end"
    # At most 4-5 threads live at once, each with stat open and the first sample's extras.
    assert during <= 20, during
    data = json.loads((tmp_path / "proc.json").read_text())
    tids = set(data["samples"]["tid"]) - {child.pid}
    # A thread lives 0.3 s and a full sample comes every 0.5 s: about 3 of 5 are caught, over
    # the ~40 started.
    assert len(tids) >= 15, len(tids)
    # Every thread seen is read at every full sample while it lives: none is lost to a stale
    # list (its rows are consecutive full samples).
    full = data["full_t_ns"]
    times, ids = data["samples"]["t_ns"], data["samples"]["tid"]
    for tid in tids:
        seen = [full.index(t) for t, i in zip(times, ids, strict=True) if i == tid]
        assert seen == list(range(seen[0], seen[0] + len(seen))), (tid, seen)
