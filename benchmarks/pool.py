"""Pool the raw ratios of several overhead runs (their --json files) into one table, with a
bootstrap 95% interval for each median: one run's few windows cannot tell 1% from 3% on a
machine whose windows scatter by ±5-10%.

    python -m benchmarks.pool RUN1.json RUN2.json ... [--configs profkit-default,noop]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import bootstrap_interval


def pooled(runs: list[dict[str, dict[str, list[float]]]]) -> dict[str, dict[str, list[float]]]:
    """cell -> configuration -> every profiled window's ratio, over all runs."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for cell, by_config in run.items():
            for name, ratios in by_config.items():
                if name != "bare":  # bare holds rates, not ratios
                    out.setdefault(cell, {}).setdefault(name, []).extend(ratios)
    return out


def table(cells: dict[str, dict[str, list[float]]], configs: list[str] | None) -> list[str]:
    lines = [f"{'cell':<12} {'configuration':<28} {'windows':>7} {'median':>7}  95% interval"]
    for cell, by_config in cells.items():
        for name, ratios in by_config.items():
            if configs and name not in configs:
                continue
            low, high = bootstrap_interval(ratios, statistics.median)
            lines.append(
                f"{cell:<12} {name:<28} {len(ratios):>7} {statistics.median(ratios):>7.3f}  "
                f"{low:.3f}-{high:.3f}"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--configs", help="only these configurations (comma-separated)")
    args = parser.parse_args()
    runs = [json.loads(path.read_text()) for path in args.runs]
    print("\n".join(table(pooled(runs), args.configs.split(",") if args.configs else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
