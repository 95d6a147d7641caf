"""Whole Python stacks on real model code: captures of the sentence encoder (MiniLM's trained
weights, 4 threads), the same model behind a FastAPI/uvicorn handler under load, and a model
of 16 nested modules with two named threads recursing 120 frames, each at default settings.

    python -m benchmarks.deep_stacks --captures 2

Runs as root. For each capture: the stacks the walker read and how many were cut, the share
of the pool's stacks (each region's dispatcher stack, each worker sample's) whose outermost
frame is the script's <module> or a thread's bootstrap, the share of the pool's CPU whose
report row names the script's own line, and the Python thread names in the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from profkit.bundle.frames import Frame
from profkit.bundle.read import Bundle, load_bundle
from profkit.host.sandbox import quota_group
from recipes.launch import attach_args

from .common import report_json, stop_process

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    script: str
    args: tuple[str, ...]
    line_key: str | None  # the recipe's ready line names the script's own line by this key
    line_text: str | None  # or the line is the one holding this text
    warmup_s: float
    cores: float | None = None


CASES = {
    "minilm": Case(
        "encoder.py", ("--weights", "packaged", "--threads", "4"), None, "return model.encode(", 2.0
    ),
    "server": Case(
        "encoder_server.py", ("--threads", "4", "--load", "2"), "encode_line", None, 3.0, 1.5
    ),
    "deep": Case(
        "deep.py", ("--modules", "16", "--recurse", "120", "--named", "2"), "call_line", None, 1.0
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--captures", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args(argv)
    for name in args.cases.split(","):
        case = CASES[name]
        with started(case) as (pid, ready):
            line = _own_line(case, ready)
            print(f"## {name}: recipes/{case.script} {' '.join(case.args)}; own line {line}")
            for capture in range(args.captures):
                print(f"capture {capture}: {measure(pid, case, line, args.duration)}", flush=True)
    return 0


@contextlib.contextmanager
def started(case: Case) -> Iterator[tuple[int, str]]:
    with contextlib.ExitStack() as stack:
        preexec = None
        if case.cores:
            group = stack.enter_context(quota_group(case.cores))
            preexec = lambda: group.add(os.getpid())  # noqa: E731
        recipe = subprocess.Popen(
            [sys.executable, "-u", str(ROOT / "recipes" / case.script), *case.args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            preexec_fn=preexec,
        )
        try:
            assert recipe.stdout is not None
            ready = recipe.stdout.readline()
            time.sleep(case.warmup_s)
            yield recipe.pid, ready
        finally:
            stop_process(recipe, signal.SIGTERM)


def measure(pid: int, case: Case, line: int, duration: float) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "b"
        began = time.monotonic()
        attached = subprocess.run(
            [
                sys.executable,
                "-m",
                "profkit",
                *attach_args(pid, duration=duration, out=out, report=False),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        prompt_s = time.monotonic() - began
        if attached.returncode != 0:
            return f"exit {attached.returncode}: {attached.stderr.strip()}"
        bundle_dir = out
        python = json.loads((bundle_dir / "ebpf.json").read_text())["python"]
        counts = python.get("counts", {})
        bundle = load_bundle(bundle_dir)
        pool = pool_stacks(bundle)
        samples = [s for s in python_sample_stacks(bundle) if s]
        report = report_json(bundle_dir)
        rows = [r for r in report["attribution"] if r["pool"] == "openmp"]
        own = sum(r["share"] for r in rows if _user_is(r, case.script, line))
        names = sorted(
            {t["name"] for t in report["cpu"]["threads"]} - {"python", "python3", "MainThread"}
        )
        return (
            f"walker {python['walker']}, stacks walked {counts.get('walked', '?')}, "
            f"cut {counts.get('truncated', '?')}; pool stacks {len(pool)}, "
            f"reaching the root {_share(pool, case.script):.3f}; Python samples {len(samples)}, "
            f"reaching the root {_share(samples, case.script):.3f}, deepest "
            f"{max((len(s) for s in samples), default=0)}; pool stacks through the script's "
            f"line {_through(pool, case.script, line):.3f}; pool CPU whose own-code line is the "
            f"script's {own:.3f}; thread names {names[:6]}; prompt {prompt_s:.1f} s"
        )


def reaches_root(frames: Sequence[Frame], script: str) -> bool:
    """The stack's outermost frame is the script's <module>, or the bootstrap of a thread that
    threading started (a thread's stack has no <module> of its own)."""
    if not frames:
        return False
    root = frames[0]
    if root.function == "<module>" and root.file.endswith(script):
        return True
    return root.function == "Thread._bootstrap" and root.file.endswith("threading.py")


def _share(stacks: Sequence[Sequence[Frame]], script: str) -> float:
    return float(np.mean([reaches_root(s, script) for s in stacks])) if stacks else float("nan")


def pool_stacks(bundle: Bundle) -> list[tuple[Frame, ...]]:
    """The stacks that place the pool's CPU in the window: each region's dispatcher stack and
    each worker sample's, one entry per region or sample."""
    sched = bundle.sched
    if sched is None:
        return []
    opened, closed = bundle.window
    found: list[tuple[Frame, ...]] = []
    inside = (sched.region_start >= opened) & (sched.region_start <= closed)
    for index in sched.stacks_of_regions()[inside].tolist():
        found.append(sched.python_stacks[index].frames if index >= 0 else ())
    dispatched = sched.dispatched
    if dispatched is not None:
        keep = (dispatched.t_ns >= opened) & (dispatched.t_ns <= closed) & (dispatched.stack >= 0)
        found += [sched.python_stacks[i].frames for i in dispatched.stack[keep].tolist()]
    return found


def python_sample_stacks(bundle: Bundle) -> list[tuple[Frame, ...]]:
    """The eBPF walker's samples of the Python threads in the window, each sample's stack."""
    spans = bundle.pyspy
    if spans is None or spans.source != "ebpf":
        return []
    opened, closed = bundle.window
    keep = (spans.start_ns >= opened) & (spans.start_ns <= closed)
    return [
        tuple(spans.frames[i] for i in spans.stacks[stack]) for stack in spans.stack[keep].tolist()
    ]


def _through(stacks: Sequence[Sequence[Frame]], script: str, line: int) -> float:
    """The share of the stacks with a frame at the script's line."""
    found = [any(f.file.endswith(script) and f.line == line for f in s) for s in stacks]
    return float(np.mean(found)) if found else float("nan")


def _user_is(row: dict, script: str, line: int) -> bool:
    user = row.get("user_frame")
    return bool(user and user["file"].endswith(script) and user["line"] == line)


def _own_line(case: Case, ready: str) -> int:
    if case.line_key:
        found = re.search(rf"{case.line_key}=(\d+)", ready)
        if not found:
            raise SystemExit(f"the recipe's ready line names no {case.line_key}: {ready!r}")
        return int(found[1])
    text = (ROOT / "recipes" / case.script).read_text().splitlines()
    return next(
        n for n, source in enumerate(text, 1) if case.line_text and case.line_text in source
    )


if __name__ == "__main__":
    sys.exit(main())
