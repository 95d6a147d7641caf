"""What one parallel region costs the thread that dispatches it, part by part (root; bcc for
the bcc parts).

    sudo .venv/bin/python -m benchmarks.region_cost [--rounds 3] [--seconds 2] [--depth 10]
        [--loader both|core|bcc] [--program-time]

This process copies a 256-KB tensor in a loop with a pool of 2 (one OpenMP region per copy;
OMP_WAIT_POLICY=passive, so that no thread spins at the barrier) and measures its own thread's
CPU time per copy (time.thread_time: user and system time, the uprobe traps included) while
profkit's region program is attached to it in successively larger parts:

    entry trap        the entry uprobe, with an empty handler
    traps             the entry and region-end uprobes, empty handlers
    regions           profkit's region program without the walker: bookkeeping maps, region log
    + tstate lookup   the walker's thread-state lookup, no frame read
    + frame walk      the frames read (--depth more under the loop), no stack map updated
    walker            the whole region program as a capture loads it
    + sampler         with the on-CPU sampler (cpu-clock, 49 Hz) on every CPU
    + scheduler       and the scheduler tracepoints in the same program
    CO-RE regions     the prebuilt CO-RE program's region probes (libbpf), no thread state known
    CO-RE walker      the prebuilt CO-RE program's region probes and walker
    CO-RE + sampler   and its on-CPU sampler

Windows alternate, every part once per round, with two bare windows per round (bare and its
A/A control); `--loader core` runs the CO-RE parts alone, where bcc is missing. Prints the
median CPU per copy of each part over the rounds and what each part adds per region against the
bare median.

`--program-time` turns on the kernel's BPF run-time statistics (kernel.bpf_stats_enabled, put
back as it was at exit) and prints, for the CO-RE parts, the time spent inside each program per
run: the part of a region's cost that is profkit's code rather than the traps around it. The
statistics add two clock reads to every run, so the per-copy figures of such a run are not the
ones to hold against a bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch loads its OpenMP runtime

import torch

from profkit.capture.ebpf.core_program import entry_cookie, load_process
from profkit.capture.ebpf.libbpf import CoreObject
from profkit.capture.ebpf.loader import BpfProgram, load_bcc
from profkit.capture.ebpf.probe_points import entry_point, gomp_region_end
from profkit.capture.ebpf.programs import OpenMPProgram, SchedProgram
from profkit.capture.ebpf.pywalk import compile_flags
from profkit.capture.ebpf.returns import file_offset
from profkit.host.pyruntime import detect, thread_states
from profkit.host.target import Runtime

EMPTY = """
int on_entry_0(struct pt_regs *ctx) { return 0; }
int on_region_return(struct pt_regs *ctx) { return 0; }
"""
SAMPLE_HZ = 49
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
CORE_PROGRAMS = ("on_region_entry", "on_region_return", "on_cpu_sample")


def cpu_per_copy(
    source: torch.Tensor, destination: torch.Tensor, seconds: float, depth: int
) -> tuple[float, int]:
    """(this thread's CPU seconds per copy, copies) over `seconds`, `depth` frames deeper."""
    if depth > 0:
        return cpu_per_copy(source, destination, seconds, depth - 1)
    done, begin, cpu = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - begin < seconds:
        for _ in range(200):
            destination.copy_(source)
        done += 200
    return (time.thread_time() - cpu) / done, done


class Part:
    def __init__(self, name: str, attach: Callable[[], BpfProgram | CoreObject | None]) -> None:
        self.name = name
        self.attach = attach
        self.per_copy: list[float] = []
        self.regions_per_copy: list[float] = []
        self.program_ns: dict[str, list[float]] = {}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--depth", type=int, default=10, help="Python frames under the loop")
    parser.add_argument("--loader", choices=["both", "core", "bcc"], default="both")
    parser.add_argument(
        "--program-time", action="store_true", help="time inside each CO-RE program per run"
    )
    args = parser.parse_args()
    if args.program_time:
        stats_were = STATS.read_text().strip()
        STATS.write_text("1")
        try:
            return run(args)
        finally:
            STATS.write_text(stats_were)
    return run(args)


def run(args: argparse.Namespace) -> int:
    bcc = load_bcc() if args.loader != "core" else None
    torch.set_num_threads(2)
    libs = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    if not libs:
        raise SystemExit("this torch bundles no libgomp")
    path = os.path.realpath(libs[0])
    entry, end = entry_point(path, "GOMP_parallel"), gomp_region_end(path)
    if entry is None or end is None:
        raise SystemExit(f"{path}: no emulated entry or region-end point")
    pid = os.getpid()
    layout = detect(pid)
    walker = compile_flags(layout)

    def load(source: str, flags: list[str], sample: bool = False) -> BpfProgram:
        assert bcc is not None
        bpf = bcc.BPF(text=source, cflags=flags)
        if "-DPYSTACK" in flags:
            table = bpf["tstates"]
            for tid, tstate in thread_states(pid, layout).items():
                table[table.Key(tid)] = table.Leaf(tstate)
        if sample:
            bpf.attach_perf_event(
                ev_type=bcc.PerfType.SOFTWARE,
                ev_config=bcc.PerfSWConfig.CPU_CLOCK,
                fn_name="on_cpu_sample",
                sample_freq=SAMPLE_HZ,
            )
        return bpf

    def attached(bpf: BpfProgram, end_probe: bool = True) -> BpfProgram:
        bpf.attach_uprobe(name=path, addr=entry.address, fn_name="on_entry_0", pid=pid)
        if end_probe:
            bpf.attach_uprobe(name=path, addr=end.address, fn_name="on_region_return", pid=pid)
        return bpf

    def core(sample: bool = False, walk: bool = True) -> CoreObject:
        program = load_process(pid, layout, 1, 1 << 18, 1, 0)
        table = program["tstates"]
        for tid, tstate in thread_states(pid, layout).items() if walk else ():
            table[table.Key(tid)] = table.Leaf(tstate)
        start = file_offset(path, entry.address)
        program.attach_uprobes("on_region_entry", path, [(start, entry_cookie(0, 3))], pid)
        program.attach_uprobes("on_region_return", path, [(file_offset(path, end.address), 0)], pid)
        if sample:
            program.attach_cpu_clock("on_cpu_sample", SAMPLE_HZ)
        return program

    runtimes = (Runtime("libgomp", path),)
    regions = OpenMPProgram(runtimes, tgid=pid).source()
    with_sched = OpenMPProgram(runtimes, tgid=pid, sched=SchedProgram(pid)).source()
    bcc_parts = [
        Part("entry trap", lambda: attached(load(EMPTY, []), end_probe=False)),
        Part("traps", lambda: attached(load(EMPTY, []))),
        Part("regions", lambda: attached(load(regions, []))),
        Part("+ tstate lookup", lambda: attached(load(regions, [*walker, "-DCOST_LOOKUP_ONLY"]))),
        Part("+ frame walk", lambda: attached(load(regions, [*walker, "-DCOST_NO_STACK_MAPS"]))),
        Part("walker", lambda: attached(load(regions, walker))),
        Part("+ sampler", lambda: attached(load(regions, walker, sample=True))),
        Part("+ scheduler", lambda: attached(load(with_sched, walker, sample=True))),
    ]
    core_parts = [
        Part("CO-RE regions", lambda: core(walk=False)),
        Part("CO-RE walker", core),
        Part("CO-RE + sampler", lambda: core(sample=True)),
    ]
    parts = [
        Part("bare", lambda: None),
        *(bcc_parts if args.loader != "core" else []),
        *(core_parts if args.loader != "bcc" else []),
        Part("bare (A/A)", lambda: None),
    ]
    source = torch.ones(256 * 1024, dtype=torch.uint8)
    destination = torch.empty_like(source)
    cpu_per_copy(source, destination, 1.0, args.depth)  # warm the pool and the allocator
    shown = Path(path).relative_to(Path(torch.__file__).parent.parent)
    print(
        f"# {shown}, pool of 2, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
        f"{args.rounds} rounds of {args.seconds:g} s per part, {args.depth} extra Python frames"
    )
    for round_index in range(args.rounds):
        # Rotate the order each round, so that no part always follows another.
        order = parts[round_index % len(parts) :] + parts[: round_index % len(parts)]
        for part in order:
            bpf = part.attach()
            try:
                per_copy, copies = cpu_per_copy(source, destination, args.seconds, args.depth)
                part.per_copy.append(per_copy)
                if bpf is not None and part.name == "regions":
                    counted = int(bpf["region_count"][0].value)
                    part.regions_per_copy.append(counted / copies)
                if isinstance(bpf, CoreObject) and args.program_time:
                    for program in CORE_PROGRAMS:
                        runs, ns = bpf.run_stats(program)
                        if runs:
                            part.program_ns.setdefault(program, []).append(ns / runs)
            finally:
                if isinstance(bpf, CoreObject):
                    bpf.close()
                elif bpf is not None:
                    bpf.cleanup()
    bare = statistics.median(parts[0].per_copy)
    print(f"{'part':<18} {'us/copy':>8} {'+us/region':>11}   windows (us/copy)")
    previous = bare
    for part in parts:
        median = statistics.median(part.per_copy)
        each = " ".join(f"{v * 1e6:.2f}" for v in part.per_copy)
        step = "" if part.name.startswith("bare") else f"  (+{(median - previous) * 1e6:.2f})"
        print(f"{part.name:<18} {median * 1e6:8.2f} {(median - bare) * 1e6:+11.2f}   {each}{step}")
        if not part.name.startswith("bare"):
            previous = median
    counts = [n for part in parts if part.name == "regions" for n in part.regions_per_copy]
    if counts:
        print(f"# regions per copy counted by the region program: {statistics.median(counts):.3f}")
    timed = [part for part in parts if part.program_ns]
    if timed:
        print("# inside each program, ns per run (medians over the rounds; windows)")
        for part in timed:
            for program, values in part.program_ns.items():
                each = " ".join(f"{v:.0f}" for v in values)
                print(f"{part.name:<18} {program:<18} {statistics.median(values):8.0f}   {each}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
