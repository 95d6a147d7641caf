"""What one parallel region costs the thread that dispatches it, part by part (root; bcc for
the bcc parts), and what profkit's own measurement of it says beside that.

    sudo .venv/bin/python -m benchmarks.region_cost [--rounds 3] [--seconds 2] [--depth 10]
        [--loader both|core|bcc]

This process copies a 256-KB tensor in a loop with a pool of 2 (one OpenMP region per copy;
OMP_WAIT_POLICY=passive, so that no thread spins at the barrier) and measures its own thread's
CPU time per copy (time.thread_time: user and system time, the uprobe traps included) while
profkit's process program (probes/process.bpf.c, through each loader) is attached to it in
successively larger parts:

    traps             the entry and region-end uprobes, an empty program on each
    regions           the region programs without the walker: bookkeeping maps, region log
    + tstate lookup   the walker's thread-state lookup, no frame read (cost_parts)
    + frame walk      the frames read (--depth more under the loop), no stack map updated
    walker            the region programs as a capture loads them
    + sampler         with the on-CPU sampler (cpu-clock, 49 Hz) on every CPU
    + scheduler       and the scheduler's tracepoints

each as bcc compiles it and as the prebuilt CO-RE object loads (`--loader`). Windows alternate,
every part once per round, with two bare windows per round (bare and its A/A control). Prints
the median CPU per copy of each part over the rounds and what each part adds per region against
the bare median; then, for each loader's whole walker, what profkit itself measures a region to
cost (costs.py: the traps calibrated, the programs' run time from the kernel's statistics),
beside the dispatching thread's own figure.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch loads its OpenMP runtime

import torch

from profkit.capture.ebpf import costs, program
from profkit.capture.ebpf.loaders import LoaderName, LoadRequest, Program, load
from profkit.capture.ebpf.placement.code import file_offset
from profkit.capture.ebpf.placement.regions import find_probes, region_uprobes
from profkit.capture.ebpf.pywalk import PythonWalker
from profkit.host.pyruntime import detect
from profkit.host.target import Runtime

SAMPLE_HZ = 49


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
    def __init__(self, name: str, attach: Callable[[], Program | None]) -> None:
        self.name = name
        self.attach = attach
        self.per_copy: list[float] = []
        self.regions_per_copy: list[float] = []
        self.measured_us: list[float] = []  # profkit's own measure of a region's cost


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--depth", type=int, default=10, help="Python frames under the loop")
    parser.add_argument("--loader", choices=["both", "core", "bcc"], default="both")
    args = parser.parse_args()
    stats = costs.enable_stats()
    try:
        return run(args)
    finally:
        stats.close()


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(2)
    source = torch.ones(256 * 1024, dtype=torch.uint8)
    destination = torch.empty_like(source)
    cpu_per_copy(source, destination, 0.5, args.depth)  # warm the pool, map torch's libgomp
    pid = os.getpid()
    gomp = next(
        (f for f in find_libgomps(pid)),
        None,
    )
    if gomp is None:
        raise SystemExit("this torch maps no libgomp")
    runtime = Runtime("libgomp", gomp.path, gomp)
    copy = find_probes(0, runtime)
    if copy is None or copy.end is None:
        raise SystemExit(f"{gomp.path}: no emulated entry or region-end point")
    probes = region_uprobes(copy)
    # Its own interpreter's layout (the self-check would walk this very thread as it runs).
    walker = PythonWalker(pid, detect(pid))
    cookie = program.entry_cookie(0, 3)

    def loaded(
        loader: LoaderName,
        walk: bool,
        cost_parts: int = 0,
        sample: bool = False,
        sched: bool = False,
    ) -> Program:
        request = LoadRequest(
            pid,
            walker.layout if walk else None,
            program.Capacities(sample=1 << 12, region=1 << 18, slice=1 << 12),
            1,
            (cookie,),
            sched=sched,
            cost_parts=cost_parts,
        )
        found = load(loader, request)
        if walk:
            table = found["tstates"]
            for tid, tstate in walker_states():
                table[table.Key(tid)] = table.Leaf(tstate)
        if sample:
            found.attach_sampler(SAMPLE_HZ)
        if sched:
            found.attach_sched(waking=walk)
        found.attach_regions(probes)
        return found

    def walker_states() -> list[tuple[int, int]]:
        from profkit.host.pyruntime import thread_states

        assert walker.layout is not None
        return list(thread_states(pid, walker.layout).items())

    def traps(loader: LoaderName) -> Program:
        found = load(loader, LoadRequest(pid, None, program.COUNTERS_ONLY, 1, (cookie,)))
        path = gomp.checked()
        for probe in probes:
            assert probe.address is not None
            found.attach_calibration(path, probe.address, file_offset(path, probe.address))
        return found

    loaders: list[LoaderName] = ["bcc", "core"] if args.loader == "both" else [args.loader]
    parts = [Part("bare", lambda: None)]
    for loader in loaders:
        tag = "bcc" if loader == "bcc" else "CO-RE"

        def add(name: str, attach: Callable[[], Program | None], tag: str = tag) -> None:
            parts.append(Part(f"{tag} {name}", attach))

        add("traps", functools.partial(traps, loader))
        add("regions", functools.partial(loaded, loader, False))
        lookup = program.cost_part("COST_LOOKUP_ONLY")
        no_maps = program.cost_part("COST_NO_STACK_MAPS")
        add("+ tstate lookup", functools.partial(loaded, loader, True, lookup))
        add("+ frame walk", functools.partial(loaded, loader, True, no_maps))
        add("walker", functools.partial(loaded, loader, True))
        add("+ sampler", functools.partial(loaded, loader, True, 0, True))
        add("+ scheduler", functools.partial(loaded, loader, True, 0, True, True))
    parts.append(Part("bare (A/A)", lambda: None))
    calibrated = {
        loader: costs.calibrate(loader, *calibration_pair(loader, pid, cookie))
        for loader in loaders
    }
    shown = gomp.path
    print(
        f"# {shown}, pool of 2, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
        f"{args.rounds} rounds of {args.seconds:g} s per part, {args.depth} extra Python frames"
    )
    entry_emulated, end_emulated = copy.traps()
    trap_s = {}
    for loader, trap in calibrated.items():
        if trap is None:
            trap_s[loader] = 0.0
            continue
        print(
            f"# {loader}'s traps calibrated: emulated {trap.emulated_s * 1e6:.2f} us, "
            f"single-stepped {trap.stepped_s * 1e6:.2f} us ({trap.how})"
        )
        trap_s[loader] = trap.of(entry_emulated) + trap.of(end_emulated)
    for round_index in range(args.rounds):
        # Rotate the order each round, so that no part always follows another.
        order = parts[round_index % len(parts) :] + parts[: round_index % len(parts)]
        for part in order:
            found = part.attach()
            try:
                before = measured(found)
                per_copy, copies = cpu_per_copy(source, destination, args.seconds, args.depth)
                part.per_copy.append(per_copy)
                after = measured(found)
                if found is not None and part.name.endswith("regions"):
                    part.regions_per_copy.append((after[0] - before[0]) / copies)
                if found is not None and after[0] > before[0] and after[1] > before[1]:
                    program_s = (after[1] - before[1]) / (after[0] - before[0]) / 1e9
                    part.measured_us.append((trap_s[found.name] + program_s) * 1e6)
            finally:
                if found is not None:
                    found.close(wait=True)
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
    counts = [n for part in parts if part.name.endswith("regions") for n in part.regions_per_copy]
    if counts:
        print(f"# regions per copy counted by the region program: {statistics.median(counts):.3f}")
    print("# profkit's own measure of a region's cost (traps calibrated + programs' run time),")
    print("# against what the dispatching thread paid (its CPU per copy over bare's):")
    for part in parts:
        if part.measured_us and part.name.endswith(("walker", "sampler", "scheduler")):
            paid = (statistics.median(part.per_copy) - bare) * 1e6
            print(
                f"{part.name:<22} measured {statistics.median(part.measured_us):6.2f} us, "
                f"paid {paid:+6.2f} us a region"
            )
    return 0


def find_libgomps(pid: int) -> list:
    from profkit.host.mapped import mapped_files

    return [f for f in mapped_files(pid) if "/torch/lib/libgomp" in f.path]


def measured(found: Program | None) -> tuple[int, int]:
    """(regions entered, the region programs' nanoseconds) so far."""
    if found is None:
        return 0, 0
    table = found["runtime_entries"]
    entries = int(table[table.Key(0)].value)
    return entries, found.run_stats([*found.entry_programs(), program.REGION_END])[1]


def calibration_pair(loader: LoaderName, pid: int, cookie: int) -> tuple[object, object]:
    found = load(loader, LoadRequest(pid, None, program.COUNTERS_ONLY, 1, (cookie,)))
    return found.attach_calibration, found.detach_calibration


if __name__ == "__main__":
    sys.exit(main())
