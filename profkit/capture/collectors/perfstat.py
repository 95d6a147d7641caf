"""perf stat: per-thread software counters as a time series (hardware counters when they work)."""

from __future__ import annotations

import json

from ...bundle.parts import PERF_STAT, PERF_STAT_CSV, CollectorResult
from ...bundle.safefile import write_new
from ...host.capabilities import HARDWARE_EVENTS, SOFTWARE_EVENTS, probe_perf_events
from ...host.target import Target
from ...host.tools import find_tool
from .base import Availability, CaptureContext
from .child import ChildTool

INTERVAL_MS = 500


class PerfStatCollector:
    name = "perf_stat"

    def __init__(self) -> None:
        self._tool = find_tool("perf")
        self._child: ChildTool | None = None
        self._context: CaptureContext | None = None
        self.events: tuple[str, ...] = SOFTWARE_EVENTS
        self.unsupported: tuple[str, ...] = ()

    def available(self, target: Target) -> Availability:
        if self._tool.path is None:
            return Availability(False, "perf not found (apt-get install linux-perf)")
        software = probe_perf_events(self._tool.path, SOFTWARE_EVENTS)
        if not any(software.values()):
            return Availability(
                False,
                "perf counts no software event here (perf_event_paranoid or missing CAP_PERFMON)",
            )
        hardware = probe_perf_events(self._tool.path, HARDWARE_EVENTS)
        self.events = tuple(e for e, ok in {**software, **hardware}.items() if ok)
        self.unsupported = tuple(e for e, ok in {**software, **hardware}.items() if not ok)
        return Availability(True)

    def start(self, context: CaptureContext) -> None:
        assert self._tool.path is not None
        self._context = context
        args = [
            "stat",
            "--per-thread",
            "-p",
            str(context.target.pid),
            "-x,",
            "-I",
            str(INTERVAL_MS),
            "-e",
            ",".join(self.events),
            "-o",
            str(context.directory / PERF_STAT_CSV),
        ]
        self._child = ChildTool(self.name, self._tool.path, args, context.directory)
        context.register_child(self._child.pid)

    def progress(self) -> int:
        return 0

    def stop(self) -> CollectorResult:
        assert self._child is not None and self._context is not None
        exit_code = self._child.stop()
        raw = self._context.directory / PERF_STAT_CSV
        notes = {
            "events": list(self.events),
            "unsupported": list(self.unsupported),
            "interval_ms": INTERVAL_MS,
            "exit_code": exit_code,
            "anchor_ns": self._child.started_ns,
        }
        if not raw.exists():
            return CollectorResult(
                self.name, "failed", self._child.stderr_text()[-200:], notes=notes
            )
        rows = parse_interval_csv(raw.read_text(), self._child.started_ns)
        write_new(self._context.directory / PERF_STAT, json.dumps(rows))
        return CollectorResult(
            self.name,
            "ok",
            samples=len(rows["t_ns"]),
            start_ns=min(rows["t_ns"], default=None),
            end_ns=max(rows["t_ns"], default=None),
            files=(PERF_STAT_CSV, PERF_STAT),
            notes=notes,
        )


def parse_interval_csv(text: str, anchor_ns: int) -> dict[str, list]:
    """`perf stat -x, -I` lines: time,comm-tid,value,unit,event,... ; <not counted> is skipped."""
    out: dict[str, list] = {"t_ns": [], "tid": [], "comm": [], "event": [], "value": []}
    for line in text.splitlines():
        fields = line.strip().split(",")
        if len(fields) < 5 or line.startswith("#"):
            continue
        try:
            seconds = float(fields[0])
        except ValueError:
            continue
        comm, _, tid = fields[1].rpartition("-")
        value = fields[2]
        if value.startswith("<") or not tid.isdigit():
            continue
        out["t_ns"].append(anchor_ns + int(seconds * 1e9))
        out["tid"].append(int(tid))
        out["comm"].append(comm)
        out["event"].append(fields[4])
        out["value"].append(float(value))
    return out
