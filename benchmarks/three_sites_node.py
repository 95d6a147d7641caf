"""The three-site recipe on a node as it is, in a cgroup v2 CPU quota: captures in a row, each
with its command-to-prompt time (the report printed), its loader, method and the sites' shares.

    python -m benchmarks.three_sites_node --cores 2 --threads 16 --captures 5

Runs as root (it makes and removes a cgroup with the quota, v1 or v2). The
shares are those of the pool's CPU per call site; the recipe dispatches 1:2:3 regions of equal
work (1-MB copies), so 1/6, 2/6, 3/6 is the truth.

`--recipe encoder` captures the sentence encoder instead (recipes/encoder.py, `--library`
and `--weights` as given): the part of the pool's CPU placed in the model's code (torch.nn,
transformers, sentence-transformers) and its largest sites.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from profkit.host.sandbox import QuotaGroup, quota_group

from .common import report_json

ROOT = Path(__file__).resolve().parent.parent
SITES = ("site_one", "site_two", "site_three")
MODEL_CODE = ("/torch/nn/", "/transformers/", "/sentence_transformers/")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--captures", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--recipe", choices=["sites", "encoder"], default="sites")
    parser.add_argument("--library", default="sentence-transformers", help="the encoder's")
    parser.add_argument("--weights", default="random", help="the encoder's: random or packaged")
    parser.add_argument("extra", nargs="*", help="more `profkit attach` options, after --")
    args = parser.parse_args(argv)
    with quota_group(args.cores) as group:
        return captures(args, group)


def captures(args: argparse.Namespace, group: QuotaGroup) -> int:
    if args.recipe == "sites":
        recipe_args = ["--pool", "torch", "--threads", str(args.threads), "--mb", str(args.mb)]
    else:
        recipe_args = ["--threads", str(args.threads), "--library", args.library]
        recipe_args += ["--weights", args.weights]
    recipe = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "recipes" / f"{args.recipe}.py"), *recipe_args],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: group.add(os.getpid()),
    )
    try:
        assert recipe.stdout is not None
        print(recipe.stdout.readline().strip(), flush=True)
        time.sleep(2.0)
        attach = [sys.executable, "-m", "profkit", "attach", "--pid", str(recipe.pid)]
        attach += ["--duration", str(args.duration)]
        with tempfile.TemporaryDirectory() as scratch:
            for capture in range(args.captures):
                out = Path(scratch) / f"b{capture}"
                started = time.monotonic()
                attached = subprocess.run(
                    [*attach, "-o", str(out), *args.extra],
                    capture_output=True,
                    text=True,
                )
                prompt_s = time.monotonic() - started
                if attached.returncode != 0:
                    print(f"capture {capture}: exit {attached.returncode}: {attached.stderr}")
                    continue
                report = report_json(out)
                ebpf = (
                    json.loads((out / "ebpf.json").read_text())
                    if (out / "ebpf.json").exists()
                    else {}
                )
                rows = {r["function"]: r for r in report["attribution"] if r["pool"] == "openmp"}
                if args.recipe == "encoder":
                    decision = (
                        json.loads((out / "ebpf.json").read_text()).get("regions_decision") or {}
                        if (out / "ebpf.json").exists()
                        else {}
                    )
                    # Outside the model the truth is 0: the largest such share, and whether
                    # every such row's interval holds 0.
                    outside = [
                        r for r in rows.values() if not any(m in r["site"] for m in MODEL_CODE)
                    ]
                    in_model = sum(r["share"] for r in rows.values()) - sum(
                        r["share"] for r in outside
                    )
                    top = sorted(rows.values(), key=lambda r: -r["share"])[:4]
                    honest = all(r["share"] <= r["uncertainty"] for r in outside)
                    print(
                        f"capture {capture}: prompt {prompt_s:.1f} s "
                        f"methods={sorted({r['method'] for r in rows.values()})} "
                        f"samples={sum(r['samples'] for r in rows.values())} "
                        f"in_model={in_model:.3f} "
                        f"outside_max={max((r['share'] for r in outside), default=0):.3f} "
                        f"outside_intervals_hold_0={honest} "
                        + " ".join(
                            f"{r['function']}={r['share']:.3f}±{r['uncertainty']}" for r in top
                        )
                        + f" regions_per_s={decision.get('regions_per_s', '-')}"
                        f" duty={decision.get('duty', '-')}",
                        flush=True,
                    )
                    continue
                pools = [p for p in report["pools"] if p["runtime"] == "openmp"]
                pool_cores = pools[0]["cores"] if pools else 0.0
                first: dict = next(iter(rows.values()), {})
                shares = " ".join(
                    f"{site}={rows[site]['share']:.3f}" if site in rows else f"{site}=-"
                    for site in SITES
                )
                method = next(iter({r["method"] for r in rows.values()}), "none")
                samples = sum(r["samples"] for r in rows.values())
                regions = " ".join(f"{r['regions']}" for r in (rows.get(s, {}) for s in SITES) if r)
                with_stack = (
                    f"{pools[0]['regions_with_stack']}/{pools[0]['regions']}" if pools else "-"
                )
                loader = (ebpf.get("loader") or {}).get("name", "-")
                if not ebpf:
                    manifest = json.loads((out / "manifest.json").read_text())
                    print(f"capture {capture}: no ebpf.json: {manifest['collectors'].get('ebpf')}")
                print(
                    f"capture {capture}: prompt {prompt_s:.1f} s (window {args.duration:g} s) "
                    f"loader={loader} method={method} "
                    f"pool_cores={pool_cores} samples={samples} {shares} "
                    f"regions={regions or '-'} with_stack={with_stack} "
                    f"uncertainty={first.get('uncertainty', '-')}",
                    flush=True,
                )
    finally:
        recipe.terminate()
        recipe.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
