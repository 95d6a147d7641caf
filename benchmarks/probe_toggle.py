"""What the OpenMP region probes cost a live recipe, by switching them on and off every second
(needs root and bcc).

    sudo .venv/bin/python -m benchmarks.probe_toggle [--target serving] [--threads 64]
        [--seconds 900] [--block 1] [--layouts aa,entry,end,both,traps] [--json FILE]
    sudo .venv/bin/python -m benchmarks.probe_toggle --perf 8 --rounds 4 [--layouts ...]

benchmarks/overhead.py compares whole captures, a few windows of several seconds each; on the
serving recipe a window scatters by 2-3% against the windows around it, and longer windows
hardly lower that, so a few tenths of a percent cannot be told apart. Here the region program
is loaded once and only its uprobes are attached and detached, which takes milliseconds, so
short blocks alternate: bare, one layout, bare, the next layout, ... in a fresh shuffled order
every cycle. Each layout block's ratio is its rate over the mean of the two bare blocks around
it; the table gives the mean of those ratios with a bootstrap 95% interval, and the target's CPU
per unit of work (request or copy) in each layout against the bare blocks.

Layouts: aa (nothing attached: the A/A control) | entry (the entry probe with the Python stack
walker) | end (the region-end probe alone; with no entry it finds no open region and returns)
| both (entry with walker and end: what a capture attaches) | traps (both points, with programs
that return at once: the traps alone) | uret, uret-traps (both and traps with the end as a
uretprobe on the entry point) | perf (no probe: perf record, system-wide, as a capture
starts it, started before the block and stopped after it) | perf-child (the same perf record
started as a capture starts its tools: profkit's ChildTool, in a session of its own) | proc,
cgroup (no probe: that
collector of profkit's, sampling from this process over the block as in a capture) | pysampler
(the walker's on-CPU sampler as it ran beside perf record: a cpu-clock event at 49 Hz per CPU,
Python stacks of the Python threads) | pysampler+perf (that and perf record: how the former
default set sampled) | native (the sampler as the default set runs it now, without perf
record: every thread's Python and kernel and user stacks) | switch (what switching the probes
on and off costs beyond their traps: every probe a capture puts in the libgomp copy, each
entry point and the end, attached with the region program and at once detached as a capture
detaches them, over and over through the block; the regions that start in the moments
between are counted, so that their traps can be told from the switching) | switch2 (the same
with two probes: GOMP_parallel's entry and the end) | on-edge, off-edge (one edge inside the
block: the capture's probes attached as it starts, or detached as it ends, the other edge
outside it; against `both`, what one edge costs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import (
    TARGETS,
    alternate,
    attach_points,
    bare_around,
    bootstrap_interval,
    libgomp_of,
    load_region_program,
    region_probe_points,
    running,
    stop_process,
)
from profkit.capture.clock import monotonic_ns
from profkit.capture.collectors.base import CaptureContext, CaptureOptions, Collector
from profkit.capture.collectors.cgroupstat import CgroupCollector
from profkit.capture.collectors.child import ChildTool
from profkit.capture.collectors.perfrecord import record_args
from profkit.capture.collectors.procstat import ProcCollector
from profkit.capture.ebpf.collector import NATIVE_STACK_ENTRIES, PYTHON_SAMPLE_HZ
from profkit.capture.ebpf.loaders.bcc import BpfProgram, detach_uprobes, load_bcc
from profkit.capture.ebpf.logs import entry_count
from profkit.capture.ebpf.placement.points import entry_point, gomp_region_end
from profkit.host import procfs
from profkit.host.target import inspect

TRAPS_ONLY = """
int on_entry_0(struct pt_regs *ctx) { return 0; }
int on_region_return(struct pt_regs *ctx) { return 0; }
"""
# layout -> (program, entry probe, end probe)
LAYOUTS = {
    "aa": ("", False, False),
    "entry": ("regions", True, False),
    "end": ("regions", False, True),
    "both": ("regions", True, True),
    "traps": ("traps", True, True),
    "uret": ("regions", True, True),
    "uret-traps": ("traps", True, True),
    "perf": ("", False, False),
    "perf-child": ("", False, False),
    "proc": ("", False, False),
    "cgroup": ("", False, False),
    "pysampler": ("", False, False),
    "pysampler+perf": ("", False, False),
    "native": ("", False, False),
    "switch": ("", False, False),
    "switch2": ("", False, False),
    "on-edge": ("", False, False),
    "off-edge": ("", False, False),
}
# Layouts whose end is a uretprobe on the entry point instead of a uprobe on the region's end
# (on x86-64 kernels from 6.11 the return comes back through a syscall, not a breakpoint).
RETPROBE_LAYOUTS = {"uret", "uret-traps"}
# layout -> the program whose on-CPU sampler it attaches
ON_CPU_SAMPLERS = {"pysampler": "regions", "pysampler+perf": "regions", "native": "native"}
SAMPLERS: dict[str, Callable[[], Collector]] = {"proc": ProcCollector, "cgroup": CgroupCollector}
SETTLE_S = 0.1  # after an attach or detach, before a block is counted
# perf record reads every process's memory map as it starts (0.13 s on the 2-core machine)
PERF_SETTLE_S = 0.4


@dataclass(frozen=True)
class Block:
    layout: str
    start_ns: int
    end_ns: int
    cpu_ns: int  # the target's CPU (user + system, all threads) over the block


def process_cpu_ns(pid: int) -> int:
    stat = procfs.read_stat(pid)
    return (stat.utime_ticks + stat.stime_ticks) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


class Probes:
    """The region program and a traps-only program, loaded once; their uprobes come and go."""

    def __init__(self, pid: int, layouts: list[str]) -> None:
        bcc = load_bcc()
        self.pid, self.path = pid, libgomp_of(pid)
        entry, end = entry_point(self.path, "GOMP_parallel"), gomp_region_end(self.path)
        if entry is None or end is None:
            raise SystemExit(f"no emulated entry and end points in {self.path}")
        self.entry, self.end = entry.address, end.address
        # Only the programs the layouts use are compiled (bcc compiles each for seconds): the
        # region program always, for its entry count.
        used = {"regions"} | {LAYOUTS[layout][0] for layout in layouts if LAYOUTS[layout][0]}
        used |= {ON_CPU_SAMPLERS[layout] for layout in layouts if layout in ON_CPU_SAMPLERS}
        compile_one: dict[str, Callable[[], BpfProgram]] = {
            "regions": lambda: load_region_program(bcc, self.path, walker=True, pid=pid),
            "traps": lambda: bcc.BPF(text=TRAPS_ONLY),
            "native": lambda: load_region_program(
                bcc, self.path, walker=True, pid=pid, native_stacks=NATIVE_STACK_ENTRIES
            ),
        }
        self.programs: dict[str, BpfProgram] = {name: compile_one[name]() for name in used}
        self._bcc = bcc
        self._sampling: BpfProgram | None = None
        self.switching = Switching(self)
        self.switching2 = Switching(self, entries=1)
        self.perf = PerfRecord()
        self.sampler = Sampler(pid)

    def points(self, layout: str) -> list[tuple[BpfProgram, int, str, bool]]:
        """(program, address, handler, as a uretprobe) of each probe the layout attaches."""
        name, entry, end = LAYOUTS[layout]
        if not name:
            return []
        bpf = self.programs[name]
        ret = layout in RETPROBE_LAYOUTS
        return [(bpf, self.entry, "on_entry_0", False)] * entry + [
            (bpf, self.entry if ret else self.end, "on_region_return", ret)
        ] * end

    def attach(self, layout: str) -> None:
        if layout.startswith("perf") or layout.endswith("+perf"):
            self.perf.start(child=layout == "perf-child")
        if layout in ON_CPU_SAMPLERS:
            bpf = self.programs[ON_CPU_SAMPLERS[layout]]
            bpf.attach_perf_event(
                ev_type=self._bcc.PerfType.SOFTWARE,
                ev_config=self._bcc.PerfSWConfig.CPU_CLOCK,
                fn_name="on_cpu_sample",
                sample_freq=PYTHON_SAMPLE_HZ,
            )
            self._sampling = bpf
        if layout in SAMPLERS:
            self.sampler.start(SAMPLERS[layout]())
        if layout == "switch":
            self.switching.start()
        if layout == "switch2":
            self.switching2.start()
        for bpf, address, handler, ret in self.points(layout):
            attach = bpf.attach_uretprobe if ret else bpf.attach_uprobe
            attach(name=self.path, addr=address, fn_name=handler, pid=self.pid)

    def detach(self, layout: str) -> None:
        self.switching.stop()
        self.switching2.stop()
        self.perf.stop()
        self.sampler.stop()
        self._stop_sampling()
        for bpf, address, _, ret in self.points(layout):
            detach = bpf.detach_uretprobe if ret else bpf.detach_uprobe
            detach(name=self.path, addr=address, pid=self.pid)

    def regions(self) -> int:
        return entry_count(self.programs["regions"])

    def _stop_sampling(self) -> None:
        if self._sampling is not None:
            self._sampling.detach_perf_event(
                ev_type=self._bcc.PerfType.SOFTWARE, ev_config=self._bcc.PerfSWConfig.CPU_CLOCK
            )
            self._sampling = None

    def close(self) -> None:
        self.switching.stop()
        self.switching2.stop()
        self.perf.stop()
        self.sampler.stop()
        self._stop_sampling()
        for bpf in self.programs.values():
            bpf.cleanup()


class Switching:
    """The capture's probes on the libgomp copy attached and detached in a loop, from a thread
    of its own, as the duty cycle does at each edge of an on-time (profkit/capture/ebpf/duty.py)."""

    def __init__(self, probes: Probes, entries: int | None = None) -> None:
        self._bpf = probes.programs["regions"]
        self._pid, self._path = probes.pid, probes.path
        self.points = region_probe_points(probes.path, entries)
        self.cycles = 0
        self._attached: set[bytes] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.attach_all()
            self.detach_all()
            self.cycles += 1

    def attach_all(self) -> None:
        before = set(self._bpf.uprobe_fds)
        attach_points(self._bpf, self._path, self._pid, self.points)
        self._attached = set(self._bpf.uprobe_fds) - before

    def detach_all(self) -> None:
        detach_uprobes(self._bpf, self._attached)
        self._attached = set()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None


class Sampler:
    """One of profkit's sampling collectors, started and stopped as a capture does."""

    def __init__(self, pid: int) -> None:
        self._target = inspect(pid)
        self._collector: Collector | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def start(self, collector: Collector) -> None:
        self._scratch = tempfile.TemporaryDirectory()
        context = CaptureContext(
            self._target, Path(self._scratch.name), rate_hz=0, duration_s=0, clock=monotonic_ns
        )
        collector.start(context)
        self._collector = collector

    def stop(self) -> None:
        if self._collector is not None:
            self._collector.stop()
            self._collector = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


class PerfRecord:
    """perf record with a capture's arguments, into a scratch file that each start replaces."""

    def __init__(self) -> None:
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._child: ChildTool | None = None

    def start(self, child: bool) -> None:
        self._scratch = tempfile.TemporaryDirectory()
        directory = Path(self._scratch.name)
        args = record_args(CaptureOptions(), ["-a"], directory / "perf.data")
        if child:
            self._child = ChildTool("perf_record", "perf", args, directory)
            return
        self._process = subprocess.Popen(
            ["perf", *args, "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def stop(self) -> None:
        """As a capture stops it: SIGINT, then wait for perf to write its file and exit."""
        if self._child is not None:
            self._child.stop()
            self._child = None
        if self._process is not None:
            stop_process(self._process, timeout=10)
            self._process = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def block(
    pid: int,
    layout: str,
    seconds: float,
    first: Callable[[], None] | None = None,
    last: Callable[[], None] | None = None,
) -> Block:
    """`first` runs as the block starts, `last` as it ends: both inside it."""
    time.sleep(PERF_SETTLE_S if "perf" in layout else SETTLE_S)
    cpu, start = process_cpu_ns(pid), time.monotonic_ns()
    if first is not None:
        first()
    time.sleep(max(0.0, seconds - (time.monotonic_ns() - start) / 1e9))
    if last is not None:
        last()
    end = time.monotonic_ns()
    return Block(layout, start, end, process_cpu_ns(pid) - cpu)


# Kernel functions on the way into and out of a uprobe's breakpoint: a sample whose kernel stack
# holds one of them is CPU that the trap cost the thread.
# A uretprobe's return comes back through the uretprobe syscall where the kernel has it (x86-64,
# 6.11+), through the breakpoint elsewhere.
TRAP_PATH = {
    "asm_exc_int3",
    "exc_int3",
    "handle_swbp",
    "uprobe_notify_resume",
    "__x64_sys_uretprobe",
    "__do_sys_uretprobe",
    "uprobe_handle_trampoline",
}


def trap_profile(
    probes: Probes, layouts: list[str], seconds: float, rounds: int = 1, hz: int = 1999
) -> None:
    """Each layout's probes on for `seconds` under perf record -a -g: the share of the machine's
    samples that fall in the target's trap path, and that CPU per region (in place, with the
    caches as the target leaves them, not in a tight loop). With several rounds the layouts
    take turns in a fresh order each round and their samples are pooled: one pass over the
    layouts read the empty programs at 4.3 and 6.3 us a region in two runs, more apart than
    their samples' own scatter, so a layout is only compared with the others of its own run."""
    print(
        f"# perf record -a -g -F {hz}, {rounds} round(s) of {seconds:g} s per layout; "
        f"target pid {probes.pid}"
    )
    found = {layout: Trapped() for layout in layouts}
    order = random.Random(len(layouts))
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(rounds):
            for layout in order.sample(layouts, len(layouts)) if rounds > 1 else layouts:
                found[layout].add(record_traps(probes, layout, seconds, hz, f"{scratch}/perf.data"))
    # The end probe alone counts no regions (none was opened): it runs as often as the entry
    # does, so its cost per region is taken at the other layouts' rate.
    rates = [t.regions / t.seconds for t in found.values() if t.regions]
    usual = statistics.fmean(rates) if rates else 0.0
    print(
        f"{'layout':<7} {'regions/s':>9} {'trap CPU':>9}  per region (95%)      "
        "where (leaf functions)"
    )
    for layout, t in found.items():
        rate = t.regions / t.seconds
        cpu_s = t.trapped / hz / t.seconds
        # Poisson scatter of the trapped samples, the run's own precision
        low, high = (max(0.0, t.trapped + d * math.sqrt(t.trapped)) for d in (-1.96, 1.96))
        per = 1e6 / hz / t.seconds / (rate or usual) if rate or usual else 0.0
        shown = f"{per * t.trapped:5.1f} us ({per * low:4.1f}-{per * high:4.1f})" if per else "-"
        top = ", ".join(f"{name} {n}" for name, n in t.leaves.most_common(4))
        print(
            f"{layout:<7} {rate:>9,.0f} {cpu_s:>8.4f}c  {shown:<22} "
            f"{t.trapped} of {t.samples} samples: {top}"
        )


@dataclass
class Trapped:
    """One layout's perf samples, pooled over its rounds."""

    seconds: float = 0.0
    regions: int = 0
    samples: int = 0
    trapped: int = 0
    leaves: Counter[str] = field(default_factory=Counter)

    def add(self, other: Trapped) -> None:
        self.seconds += other.seconds
        self.regions += other.regions
        self.samples += other.samples
        self.trapped += other.trapped
        self.leaves.update(other.leaves)


def record_traps(probes: Probes, layout: str, seconds: float, hz: int, data: str) -> Trapped:
    """One layout on for `seconds` under perf record: the target's samples in the trap path."""
    probes.attach(layout)
    try:
        time.sleep(SETTLE_S)
        before, start = probes.regions(), time.monotonic()
        # --no-buildid-cache: perf would otherwise copy every library it sampled (libtorch among
        # them) into root's ~/.debug, once per install it meets.
        record = ["perf", "record", "-q", "--no-buildid-cache", "-a", "-g", "-F", str(hz)]
        record += ["-o", data]
        subprocess.run([*record, "--", "sleep", str(seconds)], check=True)
        found = Trapped(seconds=time.monotonic() - start, regions=probes.regions() - before)
    finally:
        probes.detach(layout)
    script = subprocess.run(
        # The trap path is the kernel's: libtorch's C++ names need no demangling, which was
        # most of the pass's time.
        ["perf", "script", "--no-demangle", "-i", data, "-F", "pid,tid,ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for sample in script.split("\n\n"):
        lines = sample.split("\n")
        if not lines[0].strip():
            continue
        found.samples += 1
        frames = [line.split()[-1] for line in lines[1:] if line.strip()]
        if lines[0].split()[0].split("/")[0] == str(probes.pid) and TRAP_PATH & set(frames):
            found.trapped += 1
            found.leaves[frames[0]] += 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="serving", choices=sorted(TARGETS))
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=900.0, help="the whole run")
    parser.add_argument("--block", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--layouts", default="aa,entry,end,both,traps")
    parser.add_argument("--json", help="also write every block here")
    parser.add_argument(
        "--perf",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="instead: each layout on for this long under perf record -a -g, and the target's "
        "CPU in the trap path per probe hit",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --perf: turns per layout, pooled"
    )
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    for layout in layouts:
        if layout not in LAYOUTS:
            raise SystemExit(f"unknown layout {layout}")
    if args.perf and not all(LAYOUTS[layout][0] for layout in layouts if layout != "aa"):
        raise SystemExit("--perf profiles the probe layouts only")
    with running(args.target, args.threads) as (pid, progress):
        # The programs compile during the target's warm-up, which lasts at least --warmup.
        warm_until = time.monotonic() + args.warmup
        probes = Probes(pid, layouts)
        time.sleep(max(0.0, warm_until - time.monotonic()))
        if args.perf:
            try:
                trap_profile(probes, layouts, args.perf, args.rounds)
            finally:
                probes.close()
            return 0

        def probed(layout: str) -> Block:
            probes.attach(layout)
            edges = probes.switching
            try:
                if layout == "on-edge":
                    return block(pid, layout, args.block, first=edges.attach_all)
                if layout == "off-edge":
                    edges.attach_all()
                    return block(pid, layout, args.block, last=edges.detach_all)
                return block(pid, layout, args.block)
            finally:
                probes.detach(layout)
                edges.detach_all()

        try:
            # the entry counts move only while an entry probe is on: none is before the first layout
            started_with = probes.regions()
            blocks = alternate(
                layouts,
                random.Random(args.threads),
                lambda: block(pid, "bare", args.block),
                probed,
                until=time.monotonic() + args.seconds,
            )
            regions = probes.regions() - started_with
            cycles = probes.switching.cycles
            cycles2 = probes.switching2.cycles
        finally:
            probes.close()
        time.sleep(0.2)
    rates = [progress.rate_between(b.start_ns, b.end_ns) for b in blocks]
    work = [rate * (b.end_ns - b.start_ns) / 1e9 for rate, b in zip(rates, blocks, strict=True)]
    # the entry counts grow only where the region program's entry probe is on
    probed_s = sum(
        (b.end_ns - b.start_ns + SETTLE_S * 1e9) / 1e9
        for b in blocks
        if LAYOUTS.get(b.layout, ("", False, False))[:2] == ("regions", True)
    )
    switched = {"switch", "switch2", "on-edge", "off-edge"} & set(layouts)
    # The switching layouts' regions fall in their own blocks: then no rate, only a count.
    counted = f"; {regions / probed_s:,.0f} regions/s" if probed_s and not switched else ""
    for name, made in (("switch", cycles), ("switch2", cycles2)):
        switch_s = sum((b.end_ns - b.start_ns) / 1e9 for b in blocks if b.layout == name)
        if switch_s:
            counted += f"; {name} blocks: {made / switch_s:.1f} attach-detach cycles/s"
    if switched:
        counted += f"; {regions} regions probed in all"
    print(
        f"# {args.target}, {args.threads} threads, {os.cpu_count()} CPUs, {len(blocks)} blocks "
        f"of {args.block:g} s{counted}"
    )
    print(f"{'layout':<10} {'blocks':>6} {'ratio':>7}  95% interval   CPU per unit")
    bare_cpu = sum(b.cpu_ns for b in blocks if b.layout == "bare") / sum(
        w for w, b in zip(work, blocks, strict=True) if b.layout == "bare"
    )
    print(f"{'bare':<10} {'':>6} {'':>7}  {'':13}  {bare_cpu / 1e3:8.0f} us")
    rows = [[b.layout, rate, b.cpu_ns] for b, rate in zip(blocks, rates, strict=True)]
    out: dict[str, object] = {"blocks": rows}
    for layout in layouts:
        ratios = [
            math.log(rates[i] / bare_around(rates, i))
            for i in range(1, len(blocks) - 1)
            if blocks[i].layout == layout
        ]
        low, high = bootstrap_interval(ratios, statistics.fmean)
        cpu = sum(b.cpu_ns for b in blocks if b.layout == layout) / sum(
            w for w, b in zip(work, blocks, strict=True) if b.layout == layout
        )
        length = statistics.fmean(
            (b.end_ns - b.start_ns) / 1e9 for b in blocks if b.layout == layout
        )
        print(
            f"{layout:<10} {len(ratios):>6} {math.exp(statistics.fmean(ratios)):>7.4f}  "
            f"{math.exp(low):.4f}-{math.exp(high):.4f}  {cpu / 1e3:8.0f} us "
            f"({100 * (cpu / bare_cpu - 1):+.1f}%)  {length:.2f} s"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
