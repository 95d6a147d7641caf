"""How well py-spy's samples line up with the eBPF region probes on the bundle clock.

    .venv/bin/python -m benchmarks.alignment [--rate 50] [--seconds 8]

The fan-out recipe copies a large tensor (one long OpenMP region) and then sleeps as long, so
regions and gaps alternate. A py-spy sample whose native stack is inside the OpenMP runtime was
taken inside a region; its timestamp should fall inside one. The script prints how far such
samples fall from the nearest region, and the clock shift that best lines them up: py-spy's
alignment error on this machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, fanout_command
from profkit.analysis.attribution import expand_samples, stack_info
from profkit.bundle.read import load_bundle
from recipes.launch import attach_command


def offsets(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    index = np.searchsorted(starts, times, side="right") - 1
    out = np.empty(len(times))
    for i, (t, k) in enumerate(zip(times, index, strict=True)):
        if k >= 0 and t <= ends[k]:
            out[i] = 0.0
            continue
        after = starts[k + 1] - t if k + 1 < len(starts) else np.inf
        before = t - ends[k] if k >= 0 else np.inf
        out[i] = min(after, before)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tensor-mb", type=float, default=96.0)
    parser.add_argument("--pause-ms", type=float, default=40.0)
    args = parser.parse_args()
    recipe = subprocess.Popen(
        fanout_command(
            "--threads", "2", "--tensor-mb", str(args.tensor_mb), "--pause-ms", str(args.pause_ms)
        ),
        stdout=subprocess.DEVNULL,
    )
    time.sleep(3)
    with tempfile.TemporaryDirectory() as scratch:
        bundle_dir = Path(scratch) / "b"
        subprocess.run(
            attach_command(
                recipe.pid,
                duration=args.seconds,
                rate=args.rate,
                budget=100,
                collectors="ebpf,proc,pyspy",
                out=bundle_dir,
                report=False,
            ),
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        recipe.terminate()
        bundle = load_bundle(bundle_dir)
    spans, sched = bundle.pyspy, bundle.sched
    assert spans is not None and sched is not None
    _, times, stacks = expand_samples(spans, set(spans.names))
    inside = np.array([stack_info(spans, int(s)).in_region for s in stacks])
    order = np.argsort(sched.region_start)
    starts, ends = sched.region_start[order], sched.region_end[order]
    region_ms = np.median(ends - starts) / 1e6
    print(
        f"{len(starts)} regions (median {region_ms:.1f} ms), {len(times)} py-spy samples "
        f"at {args.rate} Hz, {int(inside.sum())} with the OpenMP runtime on the stack"
    )
    print(
        f"{'shift ms':>9} {'in-region samples inside a region':>34} "
        f"{'other samples outside regions':>30}"
    )
    best = (0.0, -1.0)
    for shift_ms in np.arange(-6.0, 6.5, 0.5):
        shifted = times + int(shift_ms * 1e6)
        hit = float((offsets(shifted[inside], starts, ends) == 0).mean())
        miss = float((offsets(shifted[~inside], starts, ends) > 0).mean())
        print(f"{shift_ms:>9.1f} {hit:>34.3f} {miss:>30.3f}")
        if hit + miss > best[1]:
            best = (shift_ms, hit + miss)
    late = offsets(times[inside], starts, ends) / 1e6
    print(
        f"\nunshifted: in-region samples outside any region: {100 * (late > 0).mean():.1f}%, "
        f"distance p50 {np.percentile(late, 50):.2f} ms, p90 {np.percentile(late, 90):.2f} "
        f"ms, max {late.max():.2f} ms"
    )
    print(f"best shift: {best[0]:+.1f} ms (added to py-spy's stamps, it lines them up best)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
