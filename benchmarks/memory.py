"""profkit's own peak memory during a capture of a large pool.

    .venv/bin/python -m benchmarks.memory [--threads 64] [--seconds 60]

Polls VmHWM (peak resident set) of `profkit attach` and of each tool it starts, and prints the
peaks and the bundle's size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, fanout_command
from recipes.launch import attach_command


def peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout
    return [int(p) for p in out.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    recipe = subprocess.Popen(
        fanout_command("--threads", str(args.threads)), stdout=subprocess.DEVNULL
    )
    time.sleep(3)
    peaks: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "b"
        profkit = subprocess.Popen(
            attach_command(
                recipe.pid, duration=args.seconds, out=out, report=False, collectors="all"
            ),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        names: dict[int, str] = {}
        while profkit.poll() is None:
            peaks["profkit"] = max(peaks.get("profkit", 0), peak_kib(profkit.pid))
            for child in children(profkit.pid):
                if child not in names:
                    try:
                        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                        names[child] = f"{Path(argv[0].decode()).name} {argv[1].decode()}"
                    except OSError:
                        continue
                key = f"{names[child]} ({child})"
                peaks[key] = max(peaks.get(key, 0), peak_kib(child))
            time.sleep(0.5)
        size = sum(p.stat().st_size for p in out.iterdir())
    recipe.terminate()
    recipe.wait()
    print(f"{args.seconds:g} s capture of a {args.threads}-thread pool, all collectors:")
    for name, kib in sorted(peaks.items(), key=lambda item: -item[1]):
        print(f"  {name:<24} peak RSS {kib / 1024:7.1f} MiB")
    print(f"  bundle size {size / 1024 / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
