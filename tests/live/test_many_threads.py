"""A target's thread count is its own to choose: four times as many threads as the usual limit of
1 024 open files must not end a capture or the agent (it ended attach with EMFILE at 1 500), and
profkit's open files must not grow with the threads. What 20 000 threads cost in time and memory
is measured side by side with a target of ten threads (benchmarks/many_threads.py), not here:
starting them alone takes a minute of this machine's test run."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import ROOT
from ..watch_support import free_port, http_get

pytestmark = pytest.mark.root
SYSTEM_LIBGOMP = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
OPEN_FILES = 1024
THREADS = 4 * OPEN_FILES
PROFKIT = (sys.executable, "-m", "profkit")
SITE = 'site="<string>:11"'  # dispatch_here's line in TARGET, the metrics' site label
# The /proc sampler keeps at most 256 descriptors open (procstat.MAX_KEPT_FILES), the rest of
# profkit a few dozen whatever the target: far below the threads, and below the limit.
MAX_OPEN = 400

TARGET = f"""
import ctypes, sys, threading, time
threading.stack_size(128 * 1024)
idle = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=idle.wait, daemon=True).start()
gomp = ctypes.CDLL({SYSTEM_LIBGOMP!r})
body = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)
gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
def dispatch_here():
    gomp.GOMP_parallel(body, None, 2, 0)
print("ready", threading.active_count(), flush=True)
while True:
    for _ in range(20):
        dispatch_here()
    time.sleep(0.01)
"""


@pytest.fixture(scope="module")
def crowd() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", TARGET, str(THREADS)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().split() == ["ready", str(THREADS + 1)]
        yield process
    finally:
        process.kill()
        process.wait(timeout=60)


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def open_files_while(process: subprocess.Popen[str]) -> int:
    """The most descriptors the process held, polled until it exits."""
    most = 0
    while process.poll() is None:
        try:
            most = max(most, len(os.listdir(f"/proc/{process.pid}/fd")))
        except OSError:
            break
        time.sleep(0.05)
    return most


def test_attach_completes_with_bounded_open_files(
    crowd: subprocess.Popen[str], tmp_path: Path
) -> None:
    out = tmp_path / "bundle"
    attach = subprocess.Popen(
        [*PROFKIT, "attach", "--pid", str(crowd.pid), "-d", "3", "--no-report", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=limited,
    )
    most = open_files_while(attach)
    stdout, stderr = attach.communicate(timeout=300)
    assert attach.returncode == 0, stderr
    assert most < MAX_OPEN, most
    report = subprocess.run(
        [sys.executable, "-m", "profkit", "report", str(out), "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert '"dispatch_here"' in report.stdout
    assert str(crowd.pid) in stdout or "complete" in stdout


def test_watch_serves_with_bounded_open_files(crowd: subprocess.Popen[str]) -> None:
    port = free_port()
    listen = f"127.0.0.1:{port}"
    watch = subprocess.Popen(
        [*PROFKIT, "watch", "--pid", str(crowd.pid), "--interval", "2", "--listen", listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        preexec_fn=limited,
    )
    most = [0]
    poller = threading.Thread(target=lambda: most.__setitem__(0, open_files_while(watch)))
    poller.start()
    try:
        deadline = time.monotonic() + 240
        body = ""
        while time.monotonic() < deadline and watch.poll() is None:
            try:
                body = http_get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                body = ""
            if SITE in body:
                break
            time.sleep(1)
        assert SITE in body, [line for line in body.splitlines() if "site" in line]
    finally:
        watch.terminate()
        output, _ = watch.communicate(timeout=60)
        poller.join(timeout=10)
    assert watch.returncode == 0, output
    assert most[0] < MAX_OPEN, most[0]
