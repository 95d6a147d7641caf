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

# A new thread every 0.25 s, each spinning for 2 s and writing its tid and lifetime (on the
# monotonic clock the sampler stamps with) when it ends: about eight live at once, the count
# rising and falling between full samples and staying level while one replaces another.
CHURN = """
import sys, threading, time
log = open(sys.argv[1], "a", buffering=1)
def spin():
    start = time.monotonic_ns()
    while time.monotonic_ns() < start + 2_000_000_000:
        pass
    log.write(f"{threading.get_native_id()} {start} {time.monotonic_ns()}\\n")
print("ready", flush=True)
while True:
    threading.Thread(target=spin).start()
    time.sleep(0.25)
"""


def test_threads_that_come_and_go_are_followed(tmp_path: Path) -> None:
    lives = tmp_path / "lives"
    child = subprocess.Popen(
        [sys.executable, "-c", CHURN, str(lives)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        collector = ProcCollector(interval_s=0.1)
        context = CaptureContext(
            target=inspect(child.pid),
            directory=tmp_path,
            rate_hz=1,
            duration_s=6,
            clock=monotonic_ns,
        )
        before = len(os.listdir("/proc/self/fd"))
        collector.start(context)
        collector.thread_interval_s, collector._full_every = 0.5, 5  # two full samples a second
        time.sleep(6)
        # Descriptors of exited threads are closed as the sampler goes: stat for each live
        # thread, and schedstat and status for those of the first full sample.
        alive = len(os.listdir(f"/proc/{child.pid}/task"))
        held = len(collector._fds)
        result = collector.stop()
    finally:
        child.kill()
        child.wait()
    assert result.status == "ok", result.reason
    assert len(os.listdir("/proc/self/fd")) == before, "every descriptor is closed at the end"
    assert held <= 3 * (alive + 2) + 1, (held, alive)
    data = json.loads((tmp_path / "proc.json").read_text())
    full = data["full_t_ns"]
    seen = set(data["samples"]["tid"])
    # Every thread that lived its 2 s between the first and the last full sample was read:
    # none is missed by a thread list gone stale.
    inside = [
        int(tid)
        for tid, start, end in (line.split() for line in lives.read_text().splitlines())
        if full[0] <= int(start) and int(end) <= full[-1]
    ]
    assert len(inside) >= 8, (len(inside), full[0], full[-1])
    assert set(inside) <= seen, sorted(set(inside) - seen)
    # and at every full sample while it lived (its rows are consecutive full samples)
    times, ids = data["samples"]["t_ns"], data["samples"]["tid"]
    for tid in inside:
        rows = [full.index(t) for t, i in zip(times, ids, strict=True) if i == tid]
        assert rows == list(range(rows[0], rows[0] + len(rows))) and len(rows) >= 2, (tid, rows)
