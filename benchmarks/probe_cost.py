"""What the OpenMP region probes cost per region, by where they sit (needs root and bcc).

    sudo .venv/bin/python -m benchmarks.probe_cost [--rounds 3] [--seconds 2] [--threads 2]

This process copies a 256-KB tensor in a loop (one parallel region per copy, a few us each) and
alternates bare windows with windows where profkit's region program is attached to itself, for
each probe layout: the symbol and its `ret`s (the old way), and the points
profkit.capture.ebpf.placement.points chooses, without and with the Python stack walker (the
copies run --depth Python frames deep). Prints the time per copy and the added time per region.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import load_region_program
from profkit.capture.ebpf.loaders.bcc import load_bcc
from profkit.capture.ebpf.placement.code import return_sites
from profkit.capture.ebpf.placement.points import entry_point, gomp_region_end


def copies_per_s(
    source: torch.Tensor, destination: torch.Tensor, seconds: float, depth: int = 0
) -> float:
    """Copies a second, with `depth` more Python frames under the loop (what the walker reads)."""
    if depth > 0:
        return copies_per_s(source, destination, seconds, depth - 1)
    done, begin = 0, time.perf_counter()
    while True:
        for _ in range(200):
            destination.copy_(source)
        done += 200
        now = time.perf_counter()
        if now - begin >= seconds:
            return done / (now - begin)


def layouts(path: str) -> dict[str, tuple[dict, list[int], bool]]:
    """name -> (attach_uprobe arguments of the entry, addresses of the end probes, walker)."""
    found: dict[str, tuple[dict, list[int], bool]] = {}
    returns = return_sites(path, "GOMP_parallel")
    if returns:
        found["symbol + each ret"] = ({"sym": "GOMP_parallel"}, returns, False)
    entry, end = entry_point(path, "GOMP_parallel"), gomp_region_end(path)
    if entry and end:
        found["emulated points"] = ({"addr": entry.address}, [end.address], False)
        found["emulated + walker"] = ({"addr": entry.address}, [end.address], True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=10, help="Python frames under the loop")
    args = parser.parse_args()
    bcc = load_bcc()
    torch.set_num_threads(args.threads)
    libs = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    if not libs:
        raise SystemExit("this torch bundles no libgomp")
    path = os.path.realpath(libs[0])
    source = torch.ones(256 * 1024, dtype=torch.uint8)
    destination = torch.empty_like(source)
    copies_per_s(source, destination, 1.0)
    shown = Path(path).relative_to(Path(torch.__file__).parent.parent)
    print(
        f"# {shown}, {args.threads} threads, {args.rounds} rounds of {args.seconds:g} s, "
        f"{args.depth} extra Python frames"
    )
    for name, (entry, ends, walker) in layouts(path).items():
        bare, probed = [], []
        for _ in range(args.rounds):
            bare.append(copies_per_s(source, destination, args.seconds, args.depth))
            bpf = load_region_program(bcc, path, walker)
            try:
                bpf.attach_uprobe(name=path, fn_name="on_entry_0", pid=os.getpid(), **entry)
                for address in ends:
                    bpf.attach_uprobe(
                        name=path, addr=address, fn_name="on_region_return", pid=os.getpid()
                    )
                probed.append(copies_per_s(source, destination, args.seconds, args.depth))
            finally:
                bpf.cleanup()
        per_bare = 1e6 / statistics.median(bare)
        per_probed = 1e6 / statistics.median(probed)
        print(
            f"{name:<20} {len(ends) + 1} probes: {per_bare:6.2f} us/copy bare, "
            f"{per_probed:6.2f} probed, +{per_probed - per_bare:5.2f} us per region, "
            f"ratio {per_bare / per_probed:.3f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
