"""What the facts kept for later captures (host/bootcache.py: the kernel BTF's index, the
traps' calibration) save an attach: its command-to-prompt time and its own CPU.

    .venv/bin/python -m benchmarks.kept_facts [--target fanout] [--threads 8] [--rounds 6]
        [--duration 0.5]

The target runs throughout. Each round runs three attaches in a fresh order: "fresh" (the
kept facts removed first, so it parses the BTF and calibrates the traps itself), "kept" and
"kept again" (the A/A control: the same arm twice, so their difference is the noise). Printed
per attach: wall seconds, profkit's CPU seconds (its own and its children's, from the kernel's
rusage) and whether the manifest's traps were kept; then each arm's median.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import running
from profkit.host import bootcache
from recipes.launch import attach_command

ARMS = ("fresh", "kept", "kept again")


def attach(pid: int, duration: float) -> tuple[float, float, bool]:
    with tempfile.TemporaryDirectory() as scratch:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        subprocess.run(
            attach_command(pid, duration=duration, out=f"{scratch}/b", report=False),
            capture_output=True,
            check=True,
        )
        wall = time.monotonic() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        ebpf = json.loads(Path(scratch, "b", "ebpf.json").read_text())
        traps = ebpf["costs"]["traps"] or {}
        return wall, cpu, bool(traps.get("kept"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="fanout")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=float, default=0.5)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    with running(args.target, args.threads) as (pid, _):
        time.sleep(3)
        attach(pid, args.duration)  # the first attach's page cache is not an arm's
        print(f"{'round':>5}  {'arm':<10}  {'wall_s':>6}  {'cpu_s':>5}  kept")
        for round_ in range(args.rounds):
            for arm in random.sample(ARMS, len(ARMS)):
                if arm == "fresh":
                    for entry in bootcache.DIRECTORY.glob("*"):
                        entry.unlink()
                wall, cpu, kept = attach(pid, args.duration)
                results[arm].append((wall, cpu))
                print(f"{round_:>5}  {arm:<10}  {wall:6.2f}  {cpu:5.2f}  {kept}")
    print(f"\nmedians over {args.rounds} rounds ({args.target}, {args.threads} threads)")
    for arm in ARMS:
        walls, cpus = zip(*results[arm], strict=True)
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(f"  {arm:<10}  wall {wall:.2f} s  cpu {cpu:.2f} s")


if __name__ == "__main__":
    main()
