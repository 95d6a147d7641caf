"""A whole `profkit attach`, start-up and teardown included: command-to-prompt time, and what
the span that contains it costs the target.

    .venv/bin/python -m benchmarks.attach_span [--target fanout] [--threads 8] [--rounds 3]
        [--duration 5] [--span 12] [--collectors all]

The target runs throughout. Spans of --span seconds alternate: bare, then one that starts a
`profkit attach --duration D --no-report` at its beginning (default collectors), then bare, then
an A/A control (a child that sleeps as long as the last attach took, nothing else), in a fresh
order every round. A span's ratio is its throughput over the mean of the bare spans around it.
Printed per attach: command-to-prompt seconds, start-up (command to window open), window and
teardown (window close to prompt), and the span ratio; then the medians, and the ranges of what
each manifest says: the tools' start-up CPU and each collector's teardown (the figures
docs/safety.md quotes).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, TARGETS, alternate, bare_around, running, sleep_in_child
from recipes.launch import attach_command


def attach(pid: int, duration: float, collectors: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        began = time.monotonic_ns()
        subprocess.run(
            attach_command(
                pid, duration=duration, out=f"{scratch}/b", report=False, collectors=collectors
            ),
            capture_output=True,
            check=False,
            cwd=ROOT,
        )
        ended = time.monotonic_ns()
        manifest = json.loads(Path(f"{scratch}/b/manifest.json").read_text())
    window = manifest["window"]
    return {
        "prompt_s": (ended - began) / 1e9,
        "startup_s": (window["start_ns"] - began) / 1e9,
        "window_s": (window["end_ns"] - window["start_ns"]) / 1e9,
        "teardown_s": (ended - window["end_ns"]) / 1e9,
        "startup_tools_cpu_s": manifest["startup"]["tools_cpu_s"],
        **{f"teardown {name}": s for name, s in manifest["teardown_s"].items()},
    }


def span(
    kind: str,
    pid: int,
    seconds: float,
    duration: float,
    last_prompt_s: float,
    collectors: str | None,
) -> tuple:
    start = time.monotonic_ns()
    timing: dict[str, float] = {}
    if kind == "attach":
        timing = attach(pid, duration, collectors)
    elif kind == "noop":
        sleep_in_child(last_prompt_s)
    remaining = seconds - (time.monotonic_ns() - start) / 1e9
    if remaining < 0:
        raise SystemExit(f"the attach took longer than --span {seconds:g} s: raise --span")
    time.sleep(remaining)
    return kind, start, time.monotonic_ns(), timing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="fanout", choices=sorted(TARGETS))
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--span", type=float, default=12.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--collectors", help="attach's --collectors (default: its default set)")
    args = parser.parse_args()
    with running(args.target, args.threads) as (pid, progress):
        last = args.duration + 3.0  # the A/A control sleeps as long as the last attach took

        def run(kind: str) -> tuple:
            nonlocal last
            done = span(kind, pid, args.span, args.duration, last, args.collectors)
            if kind == "attach":
                last = done[3]["prompt_s"]
            return done

        time.sleep(args.warmup)
        spans = alternate(
            ["attach", "noop"],
            random.Random(args.threads),
            lambda: run("bare"),
            run,
            rounds=args.rounds,
        )
        time.sleep(0.2)
        rates = [progress.rate_between(s, e) for _, s, e, _ in spans]
    print(
        f"# {args.target}, {args.threads} threads, {args.rounds} rounds, attach --duration "
        f"{args.duration:g} inside {args.span:g}-s spans, collectors "
        f"{args.collectors or 'default'}"
    )
    ratios: dict[str, list[float]] = {"attach": [], "noop": []}
    timings: list[dict[str, float]] = []
    for index, (kind, _, _, timing) in enumerate(spans):
        if kind == "bare":
            continue
        ratio = rates[index] / bare_around(rates, index)
        ratios[kind].append(ratio)
        if kind == "attach":
            timings.append(timing)
            print(
                f"attach: prompt {timing['prompt_s']:.2f} s (start-up {timing['startup_s']:.2f}, "
                f"window {timing['window_s']:.2f}, teardown {timing['teardown_s']:.2f}), "
                f"span ratio {ratio:.3f}"
            )
        else:
            print(f"noop:   span ratio {ratio:.3f}")
    keys = sorted({key for t in timings for key in t} - {"window_s"})
    for key in keys:
        values = [t[key] for t in timings if key in t]
        low, high = min(values), max(values)
        print(f"median {key}: {statistics.median(values):.2f} ({low:.2f}-{high:.2f})")
    for kind, values in ratios.items():
        print(
            f"median span ratio {kind}: {statistics.median(values):.3f} "
            f"({min(values):.3f}-{max(values):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
