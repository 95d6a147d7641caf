"""py-spy: Python stacks (with native frames) of every Python thread, on the bundle clock.

`record --native` ptrace-stops every thread of the target for each sample, so the rate is kept
low by default (docs/collectors.md has the measured cost). py-spy's chrometrace output is the
one format that keeps time; `--threads` puts each thread's OS tid in a root frame.
"""

from __future__ import annotations

import json
import math
import re
import signal
from pathlib import Path

from .. import procfs
from ..target import Target
from ..tools import find_tool
from .base import Availability, CaptureContext, CollectorResult
from .child import ChildTool

THREAD_FRAME = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")
RAW_FILE = "pyspy.chrometrace.json"
NORMALISED_FILE = "pyspy.json"


class PySpyCollector:
    name = "pyspy"

    def __init__(self) -> None:
        self._tool = find_tool("py-spy")
        self._child: ChildTool | None = None
        self._context: CaptureContext | None = None

    def available(self, target: Target) -> Availability:
        if self._tool.path is None:
            return Availability(False, "py-spy not found (pip install py-spy)")
        if not self._tool.usable:
            return Availability(False, f"py-spy {self._tool.version_text} is too old")
        if not target.is_python:
            return Availability(False, "target is not a Python process")
        return Availability(True)

    def start(self, context: CaptureContext) -> None:
        assert self._tool.path is not None
        self._context = context
        args = [
            "record",
            "--pid",
            str(context.target.pid),
            "--native",
            "--idle",
            "--threads",
            "--rate",
            str(context.rate_hz),
            "--format",
            "chrometrace",
            "--output",
            str(context.directory / RAW_FILE),
            # A bound of its own, in case profkit cannot stop it.
            "--duration",
            str(math.ceil(context.duration_s) + 5),
        ]
        self._child = ChildTool(self.name, self._tool.path, args, context.directory)

    def progress(self) -> int:
        return 0  # py-spy reports its samples only when it exits

    def stop(self) -> CollectorResult:
        assert self._child is not None and self._context is not None
        exit_code = self._child.stop(grace_s=5.0)
        resumed = resume_if_stopped(self._context.target.pid)
        raw = self._context.directory / RAW_FILE
        notes: dict[str, object] = {
            "rate_hz": self._context.rate_hz,
            "exit_code": exit_code,
            "anchor_ns": self._child.started_ns,
            "signals": self._child.signals_sent,
            "sigcont_sent_to": resumed,
            "version": self._tool.version_text,
        }
        if not raw.exists():
            return CollectorResult(
                self.name,
                "failed",
                _last_line(self._child.stderr_text()),
                notes=notes,
                files=(f"{self.name}.stderr",),
            )
        try:
            normalised = normalise(json.loads(raw.read_text()), self._child.started_ns)
        except (ValueError, KeyError) as exc:
            return CollectorResult(
                self.name, "failed", f"unreadable py-spy output: {exc}", notes=notes
            )
        normalised["sources"] = source_lines(normalised["frames"])
        (self._context.directory / NORMALISED_FILE).write_text(json.dumps(normalised))
        spans = normalised["spans"]
        samples = sum(
            round((end - start) / 1e9 * self._context.rate_hz)
            for start, end in zip(spans["start_ns"], spans["end_ns"], strict=True)
        )
        errors = re.search(r"Errors: (\d+)", self._child.stderr_text())
        notes["errors"] = int(errors.group(1)) if errors else None
        return CollectorResult(
            self.name,
            "ok",
            samples=samples,
            lost=int(notes["errors"] or 0),  # type: ignore[call-overload]
            start_ns=min(spans["start_ns"], default=None),
            end_ns=max(spans["end_ns"], default=None),
            files=(RAW_FILE, NORMALISED_FILE),
            notes=notes,
        )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "py-spy wrote no output"


def resume_if_stopped(pid: int) -> list[int]:
    """A killed py-spy can leave threads in stop state; SIGCONT them and say which."""
    stopped = []
    try:
        tids = procfs.list_tids(pid)
    except FileNotFoundError:
        return []
    for tid in tids:
        try:
            if procfs.read_stat(pid, tid).state == "T":
                stopped.append(tid)
        except FileNotFoundError:
            continue
    if stopped:
        try:
            import os

            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return stopped


def normalise(events: list[dict], anchor_ns: int) -> dict:
    """B/E events → spans: (OS tid, start, end, stack) on the monotonic clock.

    py-spy merges consecutive samples with the same frames into one slice, so a span covers
    every sample of one unchanged stack.
    """
    frames: dict[tuple[str, str, int], int] = {}
    stacks: dict[tuple[int, ...], int] = {}
    open_frames: dict[int, list[int]] = {}
    span_start: dict[int, int] = {}
    os_tid: dict[int, int] = {}
    names: dict[int, str] = {}
    out = {"tid": [], "start_ns": [], "end_ns": [], "stack": []}

    def close(thread: int, ts: int) -> None:
        current = open_frames.get(thread)
        if current and span_start.get(thread, ts) < ts:
            key = tuple(current)
            out["tid"].append(os_tid.get(thread, 0))
            out["start_ns"].append(anchor_ns + span_start[thread] * 1000)
            out["end_ns"].append(anchor_ns + ts * 1000)
            out["stack"].append(stacks.setdefault(key, len(stacks)))
        span_start[thread] = ts

    for event in sorted(events, key=lambda e: e["ts"]):
        phase = event.get("ph")
        if phase not in ("B", "E"):
            continue
        thread, ts = event["tid"], event["ts"]
        if span_start.get(thread) != ts:
            close(thread, ts)
        name = event["name"]
        stack = open_frames.setdefault(thread, [])
        match = THREAD_FRAME.match(name)
        if match and phase == "B":
            os_tid[thread] = int(match.group(1))
            names[int(match.group(1))] = match.group(2) or ""
            continue
        if match:
            continue
        if phase == "B":
            args = event.get("args", {})
            key = (name, args.get("filename", ""), int(args.get("line") or 0))
            stack.append(frames.setdefault(key, len(frames)))
        elif stack:
            stack.pop()
    return {
        "frames": [list(key) for key in frames],
        "stacks": [list(key) for key in stacks],
        "threads": {str(tid): name for tid, name in names.items()},
        "spans": out,
    }


def source_lines(frames: list[list], limit: int = 2000) -> dict[str, str]:
    """The code at each Python frame, kept so that a report names the line on another machine."""
    sources: dict[str, str] = {}
    cache: dict[str, list[str]] = {}
    for _name, filename, line in frames[:limit]:
        if not filename.endswith(".py") or line <= 0:
            continue
        if filename not in cache:
            try:
                cache[filename] = Path(filename).read_text(errors="replace").splitlines()
            except OSError:
                cache[filename] = []
        text = cache[filename]
        if line <= len(text):
            sources[f"{filename}:{line}"] = text[line - 1].strip()[:200]
    return sources
