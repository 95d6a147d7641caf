"""A soak of `profkit watch`: its memory, file descriptors and probes over a long run of targets
that restart, and what it costs them, side by side with an unwatched control arm.

    .venv/bin/python -m benchmarks.watch_soak [--minutes 30] [--restart-every 120]
        [--recipes 3] [--cores 0.25] [--interval 15] [--control-share 0.2] [--json FILE]
        [--recipe-args '--threads 2 --tensor-mb 0.25 --pause-ms 0.1']

Two arms of `--recipes` fan-out recipes each run at the same time, every recipe in its own CPU
quota of `--cores`, all restarted together every `--restart-every` seconds (a new pid, the same
command). The run has control time in which nothing is watched (an A/A control: the two arms'
throughput ratio without profkit, the method's own bias), half before and half after the watch
phase, in which `profkit watch` watches arm A through its cgroups. The cost is
1 - (A/B while watched) ÷ (A/B in the control time). Throughput is the recipes' copies per
second, from their progress lines. The agent's RSS, open file descriptors (by kind: perf
events, BPF programs and maps) and CPU are sampled every 10 s; tracefs' uprobe_events is
compared before and after the run.

Needs root (cgroups, eBPF). Runs `--minutes` in all, `--control-share` of it as control time
(a 30-minute watch phase: --minutes 37.5 --control-share 0.2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from benchmarks.common import ROOT, Progress, fanout_command, stop_process
from profkit.host import procfs
from profkit.host.sandbox import QuotaGroup, quota_group
from recipes.launch import join_quota


@dataclass
class Arm:
    name: str
    groups: list[QuotaGroup]
    runs: list[Progress] = field(default_factory=list)  # every life of every recipe

    def copies_between(self, start: float, end: float) -> float:
        """Copies between two time.monotonic() readings, over every life of the arm's recipes."""
        start_ns, end_ns = round(start * 1e9), round(end * 1e9)
        return float(sum(run.done_between(start_ns, end_ns) for run in self.runs))


class Sample(TypedDict):
    """The agent read every 10 s of the watch phase."""

    t_s: float
    rss_mib: float
    cpu_s: float
    fds: dict[str, int]
    watched: int | None
    probe_duty: float | None


def start_recipe(group: QuotaGroup, extra: list[str]) -> Progress:
    process = subprocess.Popen(
        fanout_command("--report-every", "1", *extra, unbuffered=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=join_quota(group),
        cwd=ROOT,
    )
    return Progress(process)


def stop_agent(agent: subprocess.Popen[bytes]) -> float | None:
    """SIGTERM; how long the agent took to exit, None if it had to be killed."""
    stopping = time.monotonic()
    if not stop_process(agent, signal.SIGTERM, timeout=10):
        return None
    return time.monotonic() - stopping


def stop_all(runs: list[Progress]) -> None:
    """Ctrl-C to every recipe at once, then each waited for (killed after 20 s)."""
    for run in runs:
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGINT)
    for run in runs:
        stop_process(run.process, timeout=20)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fd_kinds(pid: int) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            kind = target.split(":", 1)[1] if target.startswith("anon_inode:") else "other"
            kinds[kind] = kinds.get(kind, 0) + 1
    kinds["total"] = sum(kinds.values())
    return kinds


def agent_metrics(port: int) -> tuple[int | None, float | None]:
    """How many processes the agent watches now, and the smallest part of the time any of their
    region probes is on (1 unless switched), from its own metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None, None
    found = re.search(r"^profkit_processes (\S+)$", text, re.M)
    duties = [float(d) for d in re.findall(r"^profkit_region_probe_duty\{.*\} (\S+)$", text, re.M)]
    return (int(float(found.group(1))) if found else None), (min(duties) if duties else None)


def rss_mib(pid: int) -> float:
    return int(procfs.read_status(pid).get("VmRSS", "0 kB").split()[0]) / 1024


def uprobe_events() -> str:
    for path in ("/sys/kernel/tracing/uprobe_events", "/sys/kernel/debug/tracing/uprobe_events"):
        with contextlib.suppress(OSError):
            return Path(path).read_text()
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--restart-every", type=float, default=120.0)
    parser.add_argument("--recipes", type=int, default=3)
    parser.add_argument("--cores", type=float, default=0.25)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--control-share", type=float, default=0.2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--agent-log", type=Path, default=Path(os.devnull), help="the agent's stderr"
    )
    parser.add_argument(
        "--recipe-args",
        default="",
        help="more arguments of every fan-out recipe, one string (a flood of small paced copies: "
        "'--threads 2 --tensor-mb 0.25 --pause-ms 0.1')",
    )
    args = parser.parse_args()
    recipe_args = shlex.split(args.recipe_args)
    total_s = args.minutes * 60
    control_s = total_s * args.control_share
    events_before = uprobe_events()
    with contextlib.ExitStack() as stack:
        agent_log = stack.enter_context(args.agent_log.open("w"))
        arms = [
            Arm(name, [stack.enter_context(quota_group(args.cores)) for _ in range(args.recipes)])
            for name in ("A", "B")
        ]
        start = time.monotonic()
        agent: subprocess.Popen[bytes] | None = None
        samples: list[Sample] = []
        # The control time is split around the watch phase, so that the load of the machine
        # drifting over the run weighs on both alike.
        watch_from, watch_to = start + control_s / 2, start + total_s - control_s / 2
        next_restart = start
        next_sample = watch_from
        stop_took: float | None = None
        try:
            while time.monotonic() < start + total_s:
                now = time.monotonic()
                if now >= next_restart:
                    # Stopped together, so that neither arm is down longer than the other.
                    stop_all([r for arm in arms for r in arm.runs[-args.recipes :]])
                    for index in range(args.recipes):  # interleaved: neither arm starts first
                        for arm in arms:
                            arm.runs.append(start_recipe(arm.groups[index], recipe_args))
                    next_restart += args.restart_every
                if agent is not None and agent.returncode is None and now >= watch_to:
                    stop_took = stop_agent(agent)
                if agent is None and now >= watch_from:
                    selectors = [f"--cgroup=/{g.limited.name}" for g in arms[0].groups]
                    port = free_port()
                    agent = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "profkit",
                            "watch",
                            *selectors,
                            f"--interval={args.interval:g}",
                            f"--listen=127.0.0.1:{port}",
                        ],
                        cwd=ROOT,
                        stdout=subprocess.DEVNULL,
                        stderr=agent_log,
                    )
                if agent is not None and agent.returncode is None and now >= next_sample:
                    with contextlib.suppress(OSError):
                        watched, duty = agent_metrics(port)
                        samples.append(
                            {
                                "t_s": round(now - watch_from, 1),
                                "rss_mib": round(rss_mib(agent.pid), 1),
                                "cpu_s": procfs.read_stat(agent.pid).cpu_seconds,
                                "fds": fd_kinds(agent.pid),
                                "watched": watched,
                                "probe_duty": duty,
                            }
                        )
                    next_sample += 10
                time.sleep(0.5)
        finally:
            end = time.monotonic()
            if agent is not None and agent.returncode is None:
                stop_took = stop_agent(agent)
            stop_all([r for arm in arms for r in arm.runs])
    windows = {
        "control": [(start, watch_from), (watch_to, end)],
        "watch": [(watch_from, min(watch_to, end))],
    }
    rates = {
        phase: {
            arm.name: sum(arm.copies_between(a, b) for a, b in spans) / sum(b - a for a, b in spans)
            for arm in arms
        }
        for phase, spans in windows.items()
    }
    control_ratio = rates["control"]["A"] / rates["control"]["B"]
    watch_ratio = rates["watch"]["A"] / rates["watch"]["B"]
    # Per restart cycle: the RSS trough (between probe compiles, which briefly take tens of
    # MiB) and the most descriptors held (every probe of the cycle loaded). Flat troughs and
    # equal peaks across cycles: nothing accumulates.
    cycles: dict[int, list[Sample]] = {}
    for sample in samples[1:]:
        at = watch_from + float(sample["t_s"]) - start
        cycles.setdefault(int(at // args.restart_every), []).append(sample)
    troughs = [min(float(x["rss_mib"]) for x in c) for _, c in sorted(cycles.items())]
    fd_peaks = [max(int(x["fds"]["total"]) for x in c) for _, c in sorted(cycles.items())]
    result = {
        "minutes": args.minutes,
        "restart_every_s": args.restart_every,
        "recipes_per_arm": args.recipes,
        "cores_per_recipe": args.cores,
        "interval_s": args.interval,
        "restarts_per_recipe": len(arms[0].runs) // args.recipes - 1,
        "copies_per_s": rates,
        "control_ratio_a_over_b": control_ratio,
        "watch_ratio_a_over_b": watch_ratio,
        "cost": 1 - watch_ratio / control_ratio,
        "agent_cpu_cores": (
            (float(samples[-1]["cpu_s"]) - float(samples[0]["cpu_s"]))
            / max(1e-9, float(samples[-1]["t_s"]) - float(samples[0]["t_s"]))
            if len(samples) >= 2
            else None
        ),
        "rss_mib_trough_per_cycle": troughs,
        "rss_mib_max": max((float(x["rss_mib"]) for x in samples), default=None),
        "fds_peak_per_cycle": fd_peaks,
        "agent_stop_s": stop_took,
        "agent_exit": agent.returncode if agent is not None else None,
        "uprobe_events_unchanged": uprobe_events() == events_before,
        "samples": samples,
    }
    print(
        f"watch soak: {args.minutes:g} min, {args.recipes} recipes per arm restarted every "
        f"{args.restart_every:g} s ({result['restarts_per_recipe']} restarts each), "
        f"{args.cores:g} cores each, --interval {args.interval:g}"
    )
    print(
        f"  copies/s control A {rates['control']['A']:.2f} B {rates['control']['B']:.2f}"
        f"  ratio {control_ratio:.4f}"
    )
    print(
        f"  copies/s watched A {rates['watch']['A']:.2f} B {rates['watch']['B']:.2f}"
        f"  ratio {watch_ratio:.4f}"
    )
    print(f"  cost to the watched targets: {100 * result['cost']:+.2f}% (A/A control corrected)")
    if samples:
        print(f"  agent RSS trough per restart cycle (MiB): {troughs}; max {result['rss_mib_max']}")
        print(f"  agent fds, peak per restart cycle: {fd_peaks}; at the end {samples[-1]['fds']}")
        print(f"  agent CPU {result['agent_cpu_cores']:.4f} cores")
        duties = [d for d in (x["probe_duty"] for x in samples) if d is not None]
        if duties:
            print(f"  region probe duty: {min(duties):.3f} to {max(duties):.3f}")
    print(
        f"  agent stopped in {stop_took if stop_took is None else round(stop_took, 2)} s, "
        f"exit {result['agent_exit']}; uprobe_events unchanged: "
        f"{result['uprobe_events_unchanged']}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
