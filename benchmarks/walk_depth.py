"""What the eBPF stack walker costs by the depth of the stack it walks (root; bcc for bcc).

    sudo .venv/bin/python -m benchmarks.walk_depth [--depths 0,60,120,250,400] [--seconds 2]
        [--rounds 3] [--loader both|core|bcc]

This process copies a 256-KB tensor in a loop with a pool of 2 (one OpenMP region per copy),
`depth` Python frames below its usual stack, while the process program is loaded as a capture
loads it (the region probes with the walker, the on-CPU sampler at 49 Hz). For each depth and
loader it reads the kernel's run-time statistics (BPF_ENABLE_STATS): the region entry program's
nanoseconds a run, which hold the walk of the dispatching thread's stack at every region, and
the sampler's a run; and the depth of the stack the walker stored, and whether it was cut at
the bound. Depths and loaders take turns each round; medians of the rounds are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch loads its OpenMP runtime

import torch

from benchmarks.region_cost import cpu_per_copy, find_libgomps
from profkit.capture.ebpf import costs, program
from profkit.capture.ebpf.loaders import LoaderName, LoadRequest, load
from profkit.capture.ebpf.placement.regions import find_probes, region_uprobes
from profkit.capture.ebpf.pywalk import PythonWalker
from profkit.host.pyruntime import detect, thread_states
from profkit.host.target import Runtime

SAMPLE_HZ = 49


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--depths", default="0,60,120,250,400")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
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
    cpu_per_copy(source, destination, 0.5, 0)  # the pool warm, torch's libgomp mapped
    pid = os.getpid()
    gomp = next(iter(find_libgomps(pid)), None)
    if gomp is None:
        raise SystemExit("this torch maps no libgomp")
    copy = find_probes(0, Runtime("libgomp", gomp.path, gomp))
    if copy is None or copy.end is None:
        raise SystemExit(f"{gomp.path}: no emulated entry or region-end point")
    probes = region_uprobes(copy)
    walker = PythonWalker(pid, detect(pid))
    assert walker.layout is not None
    cookie = program.entry_cookie(0, 3)
    depths = [int(d) for d in args.depths.split(",")]
    loaders: list[LoaderName] = ["core", "bcc"] if args.loader == "both" else [args.loader]
    results: dict[tuple[LoaderName, int], list[tuple[float, float, int, bool]]] = {}
    for round_index in range(args.rounds):
        cells = [(loader, depth) for loader in loaders for depth in depths]
        shift = round_index % len(cells)
        for loader, depth in cells[shift:] + cells[:shift]:
            request = LoadRequest(
                pid,
                walker.layout,
                program.Capacities(sample=1 << 12, region=1 << 18, slice=1),
                1,
                (cookie,),
            )
            found = load(loader, request)
            try:
                table = found["tstates"]
                for tid, tstate in thread_states(pid, walker.layout).items():
                    table[table.Key(tid)] = table.Leaf(tstate)
                found.attach_sampler(SAMPLE_HZ)
                found.attach_regions(probes)
                entries = [*found.entry_programs()]
                before = found.run_stats(entries), found.run_stats([program.SAMPLER])
                cpu_per_copy(source, destination, args.seconds, depth)
                after = found.run_stats(entries), found.run_stats([program.SAMPLER])
                entry_ns = (after[0][1] - before[0][1]) / max(1, after[0][0] - before[0][0])
                sample_ns = (after[1][1] - before[1][1]) / max(1, after[1][0] - before[1][0])
                walked, cut = deepest(found)
                results.setdefault((loader, depth), []).append((entry_ns, sample_ns, walked, cut))
            finally:
                found.close(wait=True)
    print(
        f"# torch's libgomp, pool of 2, 256-KB copies, {args.rounds} rounds of {args.seconds:g} s "
        f"per cell; the walker's bound: {bound()} frames"
    )
    print(f"{'loader':<6} {'frames under the loop':>22} {'stack walked':>13} {'cut':>4} "
          f"{'entry ns/run':>13} {'sampler ns/run':>15}")  # fmt: skip
    for (loader, depth), rows in results.items():
        entry = statistics.median(r[0] for r in rows)
        sample = statistics.median(r[1] for r in rows)
        walked = max(r[2] for r in rows)
        cut = any(r[3] for r in rows)
        print(
            f"{loader:<6} {depth:>22} {walked:>13} {'yes' if cut else 'no':>4} {entry:>13.0f} "
            f"{sample:>15.0f}"
        )
    return 0


def deepest(found: object) -> tuple[int, bool]:
    """The depth of the stack with the most regions, and whether it was cut."""
    stats = found["pystack_stats"]  # type: ignore[index]
    stacks = found["pystacks"]  # type: ignore[index]
    best, regions = None, -1
    for key, value in stats.items():
        if int(value.regions) > regions:
            best, regions = key.stack, int(value.regions)
    if best is None:
        return 0, False
    stack = stacks[stacks.Key(best)]
    return int(stack.depth), bool(stack.truncated)


def bound() -> int:
    return len(program.maps()["pystacks"].value().code)


if __name__ == "__main__":
    sys.exit(main())
