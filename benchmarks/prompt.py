"""Command to prompt of `profkit attach --duration D` with the report printed, the way a user
waits for it, on the three-site recipe (recipes/sites.py, torch's pool).

    .venv/bin/python -m benchmarks.prompt [--mb 4] [--threads 4] [--rounds 5] [--duration 5]
        [--loaders core,bcc]

The recipe's copy size sets its region rate, and the rate what the region-rate check does with
the probes: large copies keep them on for the window, middling ones switch them, a flood of
small ones takes them off; each path ends the capture differently. The loaders take turns in
each round. Printed per attach: the loader, seconds from command to prompt, seconds over the
window, the eBPF teardown the manifest records, what the rate check did and the regions
logged; then the median of each loader.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, stop_process
from recipes.launch import attach_command

SITES = ROOT / "recipes" / "sites.py"


def attach(pid: int, duration: float, loader: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as scratch:
        began = time.monotonic()
        done = subprocess.run(
            attach_command(
                pid, duration=duration, out=f"{scratch}/b", extra=("--ebpf-loader", loader)
            ),
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        seconds = time.monotonic() - began
        if done.returncode != 0 or "POOL" not in done.stdout:
            raise SystemExit(f"attach failed ({done.returncode}): {done.stderr[-400:]}")
        manifest = json.loads(Path(f"{scratch}/b/manifest.json").read_text())
        ebpf = json.loads(Path(f"{scratch}/b/ebpf.json").read_text())
    window = manifest["window"]
    decision = ebpf["regions_decision"]
    # ebpf.json's typed decision; an older bundle's says it only in its reason.
    action = str(decision.get("action") or ("keep" if decision.get("traced") else "none"))
    return {
        "loader": ebpf["loader"]["name"],
        "prompt_s": seconds,
        "over_window_s": seconds - (window["end_ns"] - window["start_ns"]) / 1e9,
        "teardown_ebpf_s": manifest["teardown_s"].get("ebpf"),
        "probes": action,
        "regions": len(ebpf["regions"]["tid"]),
        "links": ebpf["loader"].get("uprobe_links", ""),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--loaders", default="core,bcc")
    args = parser.parse_args()
    loaders = args.loaders.split(",")
    target = subprocess.Popen(
        [
            sys.executable,
            str(SITES),
            "--pool",
            "torch",
            "--threads",
            str(args.threads),
            "--mb",
            str(args.mb),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    results: dict[str, list[float]] = {loader: [] for loader in loaders}
    try:
        time.sleep(3.0)
        print("# loader  prompt_s  over_window_s  teardown_ebpf_s  probes  regions  links")
        for index in range(args.rounds):
            order = loaders if index % 2 == 0 else loaders[::-1]
            for loader in order:
                row = attach(target.pid, args.duration, loader)
                results[loader].append(float(str(row["over_window_s"])))
                print(
                    f"{row['loader']:5s} {row['prompt_s']:7.2f} {row['over_window_s']:6.2f} "
                    f"{row['teardown_ebpf_s']}  {row['probes']}  {row['regions']}  {row['links']}",
                    flush=True,
                )
    finally:
        stop_process(target)
    for loader, over in results.items():
        if over:
            print(f"# median {loader}: window + {statistics.median(over):.2f} s")


if __name__ == "__main__":
    main()
