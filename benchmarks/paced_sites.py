"""The three-site recipe paced to a region rate, captured at default settings a few times in a
row: the sites' shares of the pool's CPU from the workers' samples (the sampled method, taken
from each bundle whatever method the report chose), against the truth 1/6, 2/6, 3/6.

    sudo .venv/bin/python -m benchmarks.paced_sites [--rounds-per-s 833] [--shuffle]
        [--captures 3] [--duration 6] [--perf-rate 999] [--threads 4] [--mb 0.25]

833 rounds a second of six 256-KB copies are 5 000 regions a second. Without --shuffle the
first region of each round (site_one's) wakes workers that slept through the pause, and costs
more than the others; with it, each round runs in a fresh random order and every region costs
the same on average (recipes/sites.py). `--rounds-per-s 0`: as fast as the pool goes. Each
capture's line also says what the region probes did (keep, switch or detach), at what measured
cost a region, and for how much of the window they were on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT
from profkit.analysis.attribution import by_samples
from profkit.analysis.pipeline import analyse
from profkit.bundle.read import load_bundle

TRUTH = {"site_one": 1 / 6, "site_two": 2 / 6, "site_three": 3 / 6}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds-per-s", type=float, default=833.0)
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--captures", type=int, default=3)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--perf-rate", default="999")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--mb", type=float, default=0.25)
    args = parser.parse_args()
    recipe = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "recipes" / "sites.py"),
            *("--pool", "torch", "--threads", str(args.threads), "--mb", f"{args.mb:g}"),
            *("--rounds-per-s", f"{args.rounds_per_s:g}"),
            *(["--shuffle"] if args.shuffle else []),
        ],
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    order = "shuffled" if args.shuffle else "in order"
    print(
        f"# sites.py, {args.threads} threads, {args.mb:g}-MB copies, "
        f"{args.rounds_per_s:g} rounds/s (0: unpaced), {order}"
    )
    try:
        time.sleep(3.0)  # torch imported, the pool warm
        with tempfile.TemporaryDirectory() as scratch:
            for index in range(args.captures):
                out = Path(scratch) / f"b{index}"
                subprocess.run(
                    [
                        *(sys.executable, "-m", "profkit", "attach", "--pid", str(recipe.pid)),
                        *("--duration", f"{args.duration:g}", "-o", str(out), "--no-report"),
                        *("--perf-rate", args.perf_rate),
                    ],
                    check=True,
                    capture_output=True,
                    cwd=ROOT,
                )
                bundle = load_bundle(out)
                (pool,) = [p for p in analyse(bundle).pools if p.pool.name == "openmp"]
                assert bundle.sched is not None
                sampled = by_samples(
                    bundle.sched,
                    set(pool.pool.workers),
                    pool.cores,
                    bundle.window,
                    [],
                    None,
                    bundle.perf,
                )
                ebpf = json.loads((out / "ebpf.json").read_text())
                decision = ebpf["regions_decision"]
                window_s = (bundle.window[1] - bundle.window[0]) / 1e9
                probed = decision.get("probed_s", window_s if decision["traced"] else 0.0)
                print(
                    f"capture {index}: probes {decision['action']} "
                    f"(measured {decision['cost_per_region_us']} us a region, "
                    f"{ebpf['costs'].get('region_us', '-')} us over the window), "
                    f"on {probed:.2f} of {window_s:.2f} s, "
                    f"{pool.regions} regions, {pool.attribution.method}",
                    flush=True,
                )
                if sampled is None:
                    print(f"capture {index}: no sampled attribution ({pool.attribution.reason})")
                    continue
                shares = {s.site.function: s.share for s in sampled.sites}
                worst = max(abs(shares.get(site, 0.0) - t) for site, t in TRUTH.items())
                print(
                    f"capture {index}: regions/s {decision.get('regions_per_s')} "
                    f"duty {decision.get('duty', 1.0)} report {pool.attribution.method} "
                    f"samples {sum(s.samples for s in sampled.sites)} "
                    + " ".join(f"{site}={shares.get(site, 0.0):.3f}" for site in TRUTH)
                    + f" interval ±{sampled.uncertainty:.3f} worst {worst:.3f}",
                    flush=True,
                )
    finally:
        recipe.terminate()
        recipe.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
