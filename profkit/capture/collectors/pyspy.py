"""py-spy: Python stacks (with native frames) of every Python thread, on the bundle clock.

`record --native` ptrace-stops every thread of the target for each sample, so the rate is
kept low by default, and py-spy goes --nonblocking while capturing if the target spends too
long stopped (docs/results/pyspy-cost.md has the measured cost). py-spy's chrometrace output is the
one format that keeps time; `--threads` puts each thread's OS tid in a root frame. A mode change
restarts py-spy into a new segment; segments are merged, each span carrying its own rate.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
from pathlib import Path

from ...bundle.parts import PYSPY, CollectorResult, CollectorStatus, pyspy_trace
from ...bundle.safefile import write_new
from ...host import procfs
from ...host.target import Target
from ...host.targetfs import SourceLines
from ...host.tools import find_tool
from ..startup import ATTACH_TIMEOUT_S, SETTLE_TIMEOUT_S
from .base import Availability, CaptureContext
from .child import ChildTool

THREAD_FRAME = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")


class PySpyCollector:
    name = "pyspy"

    def __init__(self) -> None:
        self._tool = find_tool("py-spy")
        self._context: CaptureContext | None = None
        self._segments: list[tuple[ChildTool, int, Path, bool]] = []
        self.rate_changes: list[dict[str, object]] = []
        self.dropped: str | None = None
        self._hurry = False

    def available(self, target: Target) -> Availability:
        if self._tool.path is None:
            return Availability(False, "py-spy not found (pip install py-spy)")
        if not self._tool.usable:
            return Availability(False, f"py-spy {self._tool.version_text} is too old")
        if not target.is_python:
            return Availability(False, "target is not a Python process")
        return Availability(True)

    def start(self, context: CaptureContext) -> None:
        self._context = context
        native = context.options.pyspy_mode != "nonblocking"
        self._start_segment(context.rate_hz, native=native)

    def _start_segment(self, rate: int, native: bool) -> None:
        assert self._tool.path is not None and self._context is not None
        context = self._context
        index = len(self._segments)
        raw = context.directory / pyspy_trace(index)
        # --native needs the target stopped per sample; --nonblocking never stops it.
        mode = ["--native"] if native else ["--nonblocking"]
        args = [
            "record",
            "--pid",
            str(context.target.pid),
            *mode,
            "--idle",
            "--threads",
            "--rate",
            str(rate),
            "--format",
            "chrometrace",
            "--output",
            str(raw),
            # A bound of its own, in case profkit cannot stop it: past the longest the window
            # can wait to open, and the window.
            "--duration",
            str(math.ceil(context.duration_s + ATTACH_TIMEOUT_S + SETTLE_TIMEOUT_S) + 5),
        ]
        child = ChildTool(
            f"{self.name}.{index}" if index else self.name, self._tool.path, args, context.directory
        )
        context.register_child(child.pid)
        self._segments.append((child, rate, raw, native))

    @property
    def rate_hz(self) -> int:
        return self._segments[-1][1] if self._segments else 0

    @property
    def native(self) -> bool:
        return bool(self._segments) and self._segments[-1][3]

    def back_off(self, reason: str, now_ns: int) -> bool:
        """Over the stop budget: from --native go --nonblocking at the same rate, which never
        stops the target but sees no native frames; from --nonblocking, stop. A lower --native
        rate is not an option: a --native attach holds the main thread stopped while py-spy
        reads libtorch's symbols, longer than the lower rate would save
        (docs/results/pyspy-cost.md#the-attach-stop).
        False once nothing is left."""
        if self.dropped or not self._segments or self._context is None:
            return False
        child, rate, _, native = self._segments[-1]
        child.stop(grace_s=exit_grace_s(rate))
        resume_if_stopped(self._context.target.pid, cut_off=native and child.killed)
        if not native:
            self.dropped = reason
            self.rate_changes.append({"t_ns": now_ns, "from": rate, "to": 0, "reason": reason})
            return False
        self.rate_changes.append(
            {"t_ns": now_ns, "from": rate, "to": rate, "native": False, "reason": reason}
        )
        self._start_segment(rate, native=False)
        return True

    def progress(self) -> int:
        return 0  # py-spy reports its samples only when it exits

    def hurry(self) -> None:
        """Someone is waiting (Ctrl-C or SIGTERM to profkit): stop() gives py-spy
        INTERRUPT_GRACE_S after SIGINT instead of its sampling gaps, then kills it."""
        self._hurry = True

    def stop(self) -> CollectorResult:
        assert self._context is not None
        cut_off = False
        for child, rate, _, native in self._segments:
            running = child.alive()
            if self._hurry:
                child.stop(grace_s=INTERRUPT_GRACE_S, hurry=True)
            else:
                child.stop(grace_s=exit_grace_s(rate))
            cut_off = cut_off or (running and native and child.killed)
        resumed = resume_if_stopped(self._context.target.pid, cut_off=cut_off)
        first = self._segments[0][0]
        notes: dict[str, object] = {
            "rate_hz": self._segments[0][1],
            "final_rate_hz": self.rate_hz,
            "rate_changes": self.rate_changes,
            "dropped": self.dropped,
            "exit_codes": [c.exit_code for c, _, _, _ in self._segments],
            "anchors_ns": [c.started_ns for c, _, _, _ in self._segments],
            "exited_ns": [c.exited_ns for c, _, _, _ in self._segments],
            "native": [n for _, _, _, n in self._segments],
            "mode_reason": self._context.options.pyspy_mode_reason,
            "sigcont_sent_to": resumed,
            # py-spy --native was killed: SIGCONT went to the target whatever its threads' state.
            "sigcont_after_kill": cut_off,
            "version": self._tool.version_text,
        }
        parts, errors = [], 0
        for child, rate, raw, native in self._segments:
            if not raw.exists():
                continue
            try:
                parts.append(normalise(json.loads(raw.read_text()), child.started_ns, rate, native))
            except (ValueError, KeyError) as exc:
                return CollectorResult(
                    self.name, "failed", f"unreadable py-spy output: {exc}", notes=notes
                )
            found = re.search(r"Errors: (\d+)", child.stderr_text())
            errors += int(found.group(1)) if found else 0
        # Killed after an interrupt, py-spy wrote nothing: it writes its samples as it exits.
        cut = [
            i for i, (c, _, raw, _) in enumerate(self._segments) if c.killed and not raw.exists()
        ]
        interrupted = (
            f"py-spy was killed {INTERRUPT_GRACE_S:g} s after the interrupt, before it wrote its "
            "samples (it notices SIGINT only at its next sample)"
        )
        if not parts:
            return CollectorResult(
                self.name,
                "failed",
                interrupted if self._hurry and cut else _last_line(first.stderr_text()),
                notes=notes,
                files=(f"{self.name}.stderr",),
            )
        normalised = merge(parts)
        normalised["sources"] = source_lines(self._context.target.pid, normalised["frames"])
        write_new(self._context.directory / PYSPY, json.dumps(normalised))
        spans = normalised["spans"]
        samples = sum(
            max(1, round((e - s) / 1e9 * r))
            for s, e, r in zip(spans["start_ns"], spans["end_ns"], spans["rate_hz"], strict=True)
        )
        lost_segments = (
            f"segment {', '.join(map(str, cut))} lost: {interrupted}" if self._hurry and cut else ""
        )
        status: CollectorStatus = "partial" if self.dropped or lost_segments else "ok"
        return CollectorResult(
            self.name,
            status,
            self.dropped or lost_segments,
            samples=samples,
            lost=errors,
            start_ns=min(spans["start_ns"], default=None),
            end_ns=max(spans["end_ns"], default=None),
            files=(*[raw.name for _, _, raw, _ in self._segments if raw.exists()], PYSPY),
            notes=notes,
        )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "py-spy wrote no output"


# After an interrupt, how long py-spy gets after SIGINT before SIGKILL: a user is waiting, and
# py-spy notices SIGINT only at its next sample and then sleeps one more gap (2 s on average at
# 1 Hz, 0.2 s at 10 Hz). It writes its samples as it exits, so a killed py-spy leaves none.
INTERRUPT_GRACE_S = 0.5


def exit_grace_s(rate_hz: int) -> float:
    """How long py-spy may take to write its output after SIGINT. It draws the gaps between
    samples from an exponential distribution (against aliasing) and only notices the signal at
    its next sample, then waits for its sampling thread to finish one more gap: two such gaps,
    2 s on average at 1 Hz. A fixed 5 s cut py-spy off at 1 Hz in a share of the captures, and
    its samples were lost with it (docs/results/own-cost.md#teardown); 10 gaps leave about one
    in 2 000 (a gamma tail)."""
    return max(5.0, 10.0 / max(1, rate_hz))


def resume_if_stopped(pid: int, cut_off: bool = False) -> list[int]:
    """A killed py-spy can leave threads in stop state; SIGCONT them and say which.

    cut_off: py-spy --native was killed, maybe mid-sample. A thread it had attached to (ptrace
    sends it SIGSTOP) may then not look stopped yet: the SIGSTOP is still pending, or taken and
    about to stop the whole process once the thread runs again. SIGCONT is then sent whatever
    /proc says, after py-spy is gone: the kernel drops a pending stop signal, and a stop taken
    but not yet acted on (the JOBCTL_STOP_DEQUEUED that SIGCONT clears), so that the target
    cannot stop later."""
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
    if stopped or cut_off:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return stopped


SPAN_COLUMNS = ("tid", "start_ns", "end_ns", "stack", "rate_hz", "native")


def empty_spans() -> dict[str, list[int]]:
    return {column: [] for column in SPAN_COLUMNS}


def normalise(events: list[dict], anchor_ns: int, rate_hz: int = 0, native: bool = True) -> dict:
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
    out = empty_spans()

    def close(thread: int, ts: int) -> None:
        current = open_frames.get(thread)
        if current and span_start.get(thread, ts) < ts:
            out["tid"].append(os_tid.get(thread, 0))
            out["start_ns"].append(anchor_ns + span_start[thread] * 1000)
            out["end_ns"].append(anchor_ns + ts * 1000)
            out["stack"].append(stacks.setdefault(tuple(current), len(stacks)))
            out["rate_hz"].append(rate_hz)
            out["native"].append(int(native))
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
        if match:
            if phase == "B":
                os_tid[thread] = int(match.group(1))
                names[int(match.group(1))] = match.group(2) or ""
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


def merge(parts: list[dict]) -> dict:
    """One frame and stack table for several segments, their spans renumbered into it."""
    frames: dict[tuple, int] = {}
    stacks: dict[tuple[int, ...], int] = {}
    merged = empty_spans()
    threads: dict[str, str] = {}
    for part in parts:
        frame_map = [frames.setdefault(tuple(f), len(frames)) for f in part["frames"]]
        stack_map = [
            stacks.setdefault(tuple(frame_map[i] for i in s), len(stacks)) for s in part["stacks"]
        ]
        threads.update(part["threads"])
        for key in SPAN_COLUMNS:
            if key != "stack":
                merged[key] += part["spans"][key]
        merged["stack"] += [stack_map[s] for s in part["spans"]["stack"]]
    return {
        "frames": [list(f) for f in frames],
        "stacks": [list(s) for s in stacks],
        "threads": threads,
        "spans": merged,
    }


def source_lines(pid: int, frames: list[list], limit: int = 2000) -> dict[str, str]:
    """The code at each Python frame, kept so that a report names the line on another machine.
    The files are the target's, read as the target could (SourceLines)."""
    sources: dict[str, str] = {}
    reader = SourceLines(pid)
    for _name, filename, line in frames[:limit]:
        if not filename.endswith(".py") or line <= 0:
            continue
        code = reader.line(filename, line)
        if code is not None:
            sources[f"{filename}:{line}"] = code
    return sources
