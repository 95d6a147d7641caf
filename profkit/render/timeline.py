"""A Chrome trace (Perfetto, chrome://tracing, speedscope) of the capture window.

One track per thread with its on-CPU and off-CPU intervals from the scheduler slices; on the
dispatcher's track the OpenMP parallel regions with their team size, the scheduler states cut
at region edges so that every slice nests; py-spy samples as instant events with their stacks;
process CPU and the cgroup's throttled periods as counter tracks.
"""

from __future__ import annotations

import itertools
import json

import numpy as np

from ..analysis.attribution import expand_samples
from ..analysis.pipeline import Report
from ..analysis.timeseries import series


def _intervals(
    starts: np.ndarray, ends: np.ndarray, voluntary: np.ndarray, lo: int, hi: int
) -> list[tuple[int, int, str]]:
    """Alternating on/off-CPU intervals of one thread within [lo, hi]."""
    order = np.argsort(starts)
    out: list[tuple[int, int, str]] = []
    cursor, last_voluntary = lo, None
    for s, e, v in zip(starts[order], ends[order], voluntary[order], strict=True):
        s, e = max(int(s), lo), min(int(e), hi)
        if e <= s:
            continue
        if s > cursor:
            reason = "sleeping" if last_voluntary else "runnable, preempted or throttled"
            out.append(
                (cursor, s, f"off-CPU ({reason})" if last_voluntary is not None else "off-CPU")
            )
        out.append((s, e, "on-CPU"))
        cursor, last_voluntary = e, bool(v)
    if cursor < hi and out:
        out.append((cursor, hi, "off-CPU (sleeping)" if last_voluntary else "off-CPU"))
    return out


def _cut(
    intervals: list[tuple[int, int, str]], regions: list[tuple[int, int]]
) -> list[tuple[int, int, str]]:
    """Split intervals at region edges, so that each piece lies inside or outside a region."""
    edges = sorted({t for r in regions for t in r})
    out = []
    for s, e, name in intervals:
        points = [s, *[t for t in edges if s < t < e], e]
        out += [(a, b, name) for a, b in itertools.pairwise(points) if b > a]
    return out


def render_timeline(report: Report) -> str:
    bundle = report.bundle
    start, end = report.cpu.start_ns, report.cpu.end_ns
    pid = bundle.manifest.target.pid or 0

    def us(t: int) -> float:
        return round((t - start) / 1000.0, 3)

    def dur(s: int, e: int) -> float:
        # Shortened by a nanosecond so that touching slices never look nested after rounding.
        return max(0.0, round(us(e) - us(s) - 0.001, 3))

    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"pid {pid}"}}
    ]
    roles = {t.tid: t for t in report.reconciliation.threads}
    dispatchers = {d for p in report.pools for d in p.pool.dispatchers}
    for share in report.reconciliation.threads:
        label = f"{share.role} {share.name} {share.tid}" + (
            " (dispatcher)" if share.tid in dispatchers else ""
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": share.tid,
                "args": {"name": label},
            }
        )
    sched = bundle.sched
    regions_by_tid: dict[int, list[tuple[int, int, int]]] = {}
    if sched is not None:
        teams = {d: p.pool.team_size for p in report.pools for d in p.pool.dispatchers}
        for tid, s, e in zip(sched.region_tid, sched.region_start, sched.region_end, strict=True):
            if e > start and s < end:
                regions_by_tid.setdefault(int(tid), []).append(
                    (max(int(s), start), min(int(e), end), teams.get(int(tid), 0))
                )
        for tid in roles:
            mask = sched.slice_tid == tid
            intervals = _intervals(
                sched.slice_start[mask],
                sched.slice_end[mask],
                sched.slice_voluntary[mask],
                start,
                end,
            )
            regions = regions_by_tid.get(tid, [])
            if regions:
                intervals = _cut(intervals, [(s, e) for s, e, _ in regions])
            for s, e, name in intervals:
                events.append(
                    {
                        "ph": "X",
                        "name": name,
                        "cat": "sched",
                        "pid": pid,
                        "tid": tid,
                        "ts": us(s),
                        "dur": dur(s, e),
                    }
                )
    for tid, regions in regions_by_tid.items():
        for s, e, team in regions:
            events.append(
                {
                    "ph": "X",
                    "name": f"parallel region (team {team})",
                    "cat": "openmp",
                    "pid": pid,
                    "tid": tid,
                    "ts": us(s),
                    "dur": dur(s, e),
                    "args": {"team_size": team},
                }
            )
    spans = bundle.pyspy
    if spans is not None:
        tids, times, stacks = expand_samples(spans, set(spans.names))
        for tid, t, stack_id in zip(tids, times, stacks, strict=True):
            if start <= t <= end:
                frames = [spans.frames[i] for i in spans.stacks[int(stack_id)]]
                python = [f for f in frames if f.is_python]
                events.append(
                    {
                        "ph": "i",
                        "s": "t",
                        "name": python[-1].function if python else "py-spy sample",
                        "cat": "py-spy",
                        "pid": pid,
                        "tid": int(tid),
                        "ts": us(int(t)),
                        "args": {"stack": " > ".join(f.function for f in frames)},
                    }
                )
    for item in series(report):
        for t, v in zip(item.t_s, item.values, strict=True):
            events.append(
                {
                    "ph": "C",
                    "name": f"{item.name} ({item.unit})",
                    "pid": pid,
                    "ts": t * 1e6,
                    "args": {item.unit: round(v, 3)},
                }
            )
    events.sort(key=lambda e: (e.get("ts", -1), -e.get("dur", 0)))
    return json.dumps(
        {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"profkit_bundle": str(bundle.directory)},
        }
    )
