"""What profiling costs the target: copies/s of the fan-out recipe, profiled ÷ bare.

    .venv/bin/python benchmarks/overhead.py [--threads 8,64] [--repeats 3] [--seconds 6]

Runs alternate (one run of every configuration per round, rounds repeated) so that drift of a
noisy machine falls on all configurations alike. Each ratio is the configuration's copies/s over
the median bare copies/s of the same pool size, measured over the window the profiler was
actually sampling; the table prints the median and the min-max spread of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYSPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"


@dataclass(frozen=True)
class Config:
    name: str
    kind: str  # "bare", "pyspy" (py-spy alone) or "profkit"
    arg: str = ""  # py-spy rate, or profkit collectors ("" = default set)
    rate: str = ""  # profkit's py-spy rate ("" = profkit's default)
    mode: str = ""  # profkit's py-spy mode ("" = profkit's default)


DEFAULT_CONFIGS = (
    "bare,pyspy-native-100hz,pyspy-native-20hz,profkit-default,profkit-default-nonblocking,"
    "profkit-proc,profkit-cgroup,profkit-perf_stat,profkit-perf_record,profkit-ebpf,"
    "profkit-pyspy"
)


def parse_config(name: str) -> Config:
    """bare | pyspy-native-<N>hz | profkit-default[-<N>hz] | profkit-<collector>[-<N>hz]."""
    if name == "bare":
        return Config(name, "bare")
    if name.startswith("pyspy-native-") and name.endswith("hz"):
        return Config(name, "pyspy", name.removeprefix("pyspy-native-").removesuffix("hz"))
    if name.startswith("profkit-"):
        rest = name.removeprefix("profkit-")
        mode = ""
        if rest.endswith("-nonblocking"):
            rest, mode = rest.removesuffix("-nonblocking"), "nonblocking"
        rate = ""
        if rest.endswith("hz") and "-" in rest:
            rest, rate = rest.rsplit("-", 1)
            rate = rate.removesuffix("hz")
        return Config(name, "profkit", "" if rest == "default" else rest, rate, mode)
    raise SystemExit(f"unknown configuration {name}")


def progress(output: str) -> list[tuple[int, int]]:
    return [
        (int(line.split("t_ns=")[1]), int(line.split()[1].split("=")[1]))
        for line in output.splitlines()
        if line.startswith("progress")
    ]


def rate_between(marks: list[tuple[int, int]], start: int, end: int) -> float:
    inside = [m for m in marks if start <= m[0] <= end]
    if len(inside) < 2:
        return float("nan")
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    return (c1 - c0) / ((t1 - t0) / 1e9)


def run_once(config: Config, threads: int, seconds: float, warmup: float) -> float:
    recipe = subprocess.Popen(
        [
            sys.executable,
            "-u",
            str(ROOT / "recipes/shm_fanout.py"),
            "--copy",
            "torch",
            "--threads",
            str(threads),
            "--report-every",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert recipe.stdout is not None
    recipe.stdout.readline()
    time.sleep(warmup)
    window = (0, 0)
    if config.kind == "bare":
        start = time.monotonic_ns()
        time.sleep(seconds)
        window = (start, time.monotonic_ns())
    elif config.kind == "pyspy":
        with tempfile.TemporaryDirectory() as scratch:
            start = time.monotonic_ns()
            subprocess.run(
                [
                    PYSPY,
                    "record",
                    "--native",
                    "--idle",
                    "--rate",
                    config.arg,
                    "--duration",
                    str(int(seconds)),
                    "--format",
                    "raw",
                    "--output",
                    f"{scratch}/out.txt",
                    "--pid",
                    str(recipe.pid),
                ],
                capture_output=True,
                check=False,
            )
            # py-spy attaches for a moment before it samples; skip its first half second.
            window = (start + 500_000_000, time.monotonic_ns())
    else:
        with tempfile.TemporaryDirectory() as scratch:
            args = [
                sys.executable,
                "-m",
                "profkit",
                "attach",
                "--pid",
                str(recipe.pid),
                "--duration",
                str(seconds),
                "--out",
                f"{scratch}/b",
                "--no-report",
            ]
            if config.arg:
                args += ["--collectors", config.arg]
            if config.rate:
                args += ["--rate", config.rate]
            if config.mode:
                args += ["--pyspy-mode", config.mode]
            subprocess.run(args, capture_output=True, check=False, cwd=ROOT)
            manifest = json.loads(Path(f"{scratch}/b/manifest.json").read_text())
            window = (manifest["window"]["start_ns"], manifest["window"]["end_ns"])
    recipe.send_signal(2)
    output = recipe.communicate(timeout=60)[0]
    return rate_between(progress(output), *window)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="8,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--json", help="also write the raw rates here")
    args = parser.parse_args()
    configs = [parse_config(name) for name in args.configs.split(",")]
    if configs[0].kind != "bare":
        configs.insert(0, parse_config("bare"))
    pools = [int(t) for t in args.threads.split(",")]
    rates: dict[tuple[int, str], list[float]] = {}
    print(f"# {os.cpu_count()} CPUs, {args.repeats} rounds, {args.seconds:g} s windows", flush=True)
    for round_index in range(args.repeats):
        for threads in pools:
            for config in configs:
                rate = run_once(config, threads, args.seconds, args.warmup)
                rates.setdefault((threads, config.name), []).append(rate)
                print(
                    f"# round {round_index + 1} threads {threads} {config.name}: "
                    f"{rate:.1f} copies/s",
                    flush=True,
                )
    print(f"\n{'threads':>7}  {'configuration':<22} {'copies/s':>9}  {'ratio':>6}  spread")
    for threads in pools:
        bare = statistics.median(rates[(threads, "bare")])
        for config in configs:
            values = rates[(threads, config.name)]
            ratios = [v / bare for v in values]
            print(
                f"{threads:>7}  {config.name:<22} {statistics.median(values):>9.1f}  "
                f"{statistics.median(ratios):>6.3f}  {min(ratios):.3f}-{max(ratios):.3f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({f"{t}:{n}": v for (t, n), v in rates.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
