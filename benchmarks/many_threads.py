"""What a target's thread count costs `profkit attach`: command to prompt, peak memory and the
most descriptors open, for a target of many idle Python threads beside one of a few, in turns,
each under a limit of 1 024 open files. The A/A control is the few-threads target against
itself (its first turns against its last).

    .venv/bin/python -m benchmarks.many_threads [--threads 20000] [--rounds 3] [--duration 5]

Both targets dispatch OpenMP regions from one function through GOMP_parallel (Debian's
libgomp1, no torch), so that each capture has a pool to place.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common import ROOT, stop_process

LIBGOMP = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
PROFKIT = (sys.executable, "-m", "profkit")
TARGET = f"""
import ctypes, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.SIG_DFL)
threading.stack_size(128 * 1024)
idle = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=idle.wait, daemon=True).start()
gomp = ctypes.CDLL({LIBGOMP!r})
body = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)
gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
print("ready", flush=True)
while True:
    for _ in range(20):
        gomp.GOMP_parallel(body, None, 2, 0)
    time.sleep(0.01)
"""


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def attach(pid: int, duration: float) -> tuple[float, float, int]:
    """(seconds from command to prompt, peak RSS in MB, most descriptors open)."""
    with tempfile.TemporaryDirectory() as scratch:
        began = time.monotonic()
        child = subprocess.Popen(
            [*PROFKIT, "attach", "--pid", str(pid), "-d", str(duration), "-o", f"{scratch}/b"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            preexec_fn=limited,
        )
        most = [0]

        def poll() -> None:
            while child.returncode is None:
                try:
                    most[0] = max(most[0], len(os.listdir(f"/proc/{child.pid}/fd")))
                except OSError:
                    return
                time.sleep(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - began
        poller.join(timeout=5)
        if child.returncode != 0:
            assert child.stderr is not None
            raise SystemExit(f"attach failed ({child.returncode}): {child.stderr.read()[-400:]}")
    return seconds, usage.ru_maxrss / 1024, most[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=20000)
    parser.add_argument("--few", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    targets = {}
    for name, count in (("few", args.few), ("many", args.threads)):
        targets[name] = subprocess.Popen(
            [sys.executable, "-c", TARGET, str(count)], stdout=subprocess.PIPE, text=True
        )
        started = targets[name].stdout
        assert started is not None
        started.readline()
    rows: dict[str, list[tuple[float, float, int]]] = {"few": [], "many": []}
    try:
        for index in range(args.rounds):
            for name in ("few", "many") if index % 2 == 0 else ("many", "few"):
                found = attach(targets[name].pid, args.duration)
                rows[name].append(found)
                print(
                    f"round {index} {name:>4} ({args.few if name == 'few' else args.threads} "
                    f"threads): {found[0]:.2f} s to prompt, window + {found[0] - args.duration:.2f}"
                    f" s, {found[1]:.0f} MB, {found[2]} descriptors",
                    flush=True,
                )
    finally:
        for process in targets.values():
            stop_process(process)
    print(f"\nmedians over {args.rounds} rounds ({args.duration:.0f}-s window):")
    for name in ("few", "many"):
        seconds, mb, fds = (statistics.median(v) for v in zip(*rows[name], strict=True))
        print(f"  {name:>4}: {seconds:.2f} s, {mb:.0f} MB, {fds:.0f} descriptors")
    few = [r[0] for r in rows["few"]]
    half = len(few) // 2
    if half:
        print(
            f"  A/A (few, first half against last half): "
            f"{statistics.median(few[:half]) / statistics.median(few[half:]):.3f}"
        )
    many = statistics.median(r[0] for r in rows["many"])
    print(f"  many / few, command to prompt: {many / statistics.median(few):.3f}")


if __name__ == "__main__":
    main()
