"""How long switching the region probes of a live recipe on and off takes (needs root and bcc).

    sudo .venv/bin/python -m benchmarks.probe_switch [--target flood] [--threads 2] [--rounds 5]

The collector switches the region probes on and off when their full cost would exceed their
part of the budget (profkit/capture/ebpf/duty.py), and the probes trap until a detach returns:
this prints how long attaching every probe of the target's libgomp takes (its entry points and
the region end, as a capture attaches them) and how long detaching them does, all at once as
the collector does (loader.detach_uprobes) and one after another as bcc's detach_uprobe does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import (
    TARGETS,
    attach_points,
    libgomp_of,
    load_region_program,
    region_probe_points,
    running,
)
from profkit.capture.ebpf.loaders.bcc import detach_uprobes, load_bcc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="flood", choices=sorted(TARGETS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--on", type=float, default=0.3, help="seconds on between switches")
    args = parser.parse_args()
    with running(args.target, args.threads) as (pid, _):
        time.sleep(2)
        path = libgomp_of(pid)
        points = region_probe_points(path)
        bpf = load_region_program(load_bcc(), path, walker=True, pid=pid)
        timings: dict[str, list[float]] = {
            "attach": [],
            "detach, all at once": [],
            "detach, one by one": [],
        }
        try:
            for round_ in range(2 * args.rounds):
                begin = time.monotonic()
                attach_points(bpf, path, pid, points)
                timings["attach"].append(time.monotonic() - begin)
                time.sleep(args.on)
                begin = time.monotonic()
                if round_ % 2:
                    for address, _ in points:
                        bpf.detach_uprobe(name=path, addr=address, pid=pid)
                    timings["detach, one by one"].append(time.monotonic() - begin)
                else:
                    detach_uprobes(bpf)
                    timings["detach, all at once"].append(time.monotonic() - begin)
                time.sleep(args.on)
        finally:
            bpf.cleanup()
    print(
        f"# {args.target}, {args.threads} threads, {Path(path).name}: "
        f"{len(points)} probes, {args.rounds} rounds"
    )
    for name, values in timings.items():
        print(
            f"{name:<20} median {1e3 * statistics.median(values):6.0f} ms  "
            f"(min {1e3 * min(values):.0f}, max {1e3 * max(values):.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
