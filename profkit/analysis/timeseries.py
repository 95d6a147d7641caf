"""Series over the window for plots: process and pool CPU, and the share of periods throttled."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .pipeline import Report


@dataclass(frozen=True)
class Series:
    name: str
    unit: str
    t_s: tuple[float, ...]  # seconds from the window's start
    values: tuple[float, ...]


def _rate(
    t_ns: np.ndarray,
    counter: np.ndarray,
    start: int,
    scale: float,
    bin_s: float,
    end: int | None = None,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-bin rate of a cumulative counter sampled at t_ns, over the window."""
    if len(t_ns) < 2:
        return (), ()
    first, last = max(int(t_ns[0]), start), min(int(t_ns[-1]), end or int(t_ns[-1]))
    if last <= first:
        first, last = int(t_ns[0]), int(t_ns[-1])
    edges = np.arange(first, last + 1, int(bin_s * 1e9))
    if len(edges) < 2:
        edges = np.array([first, last])
    values = np.interp(edges, t_ns, counter)
    rates = np.diff(values) / (np.diff(edges) / 1e9) * scale
    mids = ((edges[:-1] + edges[1:]) / 2 - start) / 1e9
    return tuple(float(m) for m in mids), tuple(float(r) for r in rates)


def series(report: Report, bin_s: float = 0.5) -> list[Series]:
    bundle, out = report.bundle, []
    start, end = report.cpu.start_ns, report.cpu.end_ns
    proc = bundle.proc
    if proc is not None:
        per_tick = 1 / float(proc.clock_ticks)
        t, v = _rate(
            proc.process_t_ns, proc.process_ticks.astype(float), start, per_tick, bin_s, end
        )
        out.append(Series("process CPU", "cores", t, v))
        workers = {w for p in report.pools for w in p.pool.workers}
        if workers:
            times = np.unique(proc.t_ns)
            total = np.zeros(len(times))
            for tid in workers:
                rows = proc.tid == tid
                if rows.any():
                    total += np.interp(
                        times, proc.t_ns[rows], proc.cpu_ticks[rows].astype(float), left=0.0
                    )
            t, v = _rate(times, total, start, per_tick, bin_s, end)
            out.append(Series("pool CPU", "cores", t, v))
    cg = bundle.cgroup
    if cg is not None and len(cg.t_ns) > 1 and cg.effective_cores is not None:
        # The share of periods throttled per bin: the rate of one counter over the other's.
        _, periods = _rate(cg.t_ns, cg.nr_periods.astype(float), start, 1.0, bin_s, end)
        t, throttled = _rate(cg.t_ns, cg.nr_throttled.astype(float), start, 1.0, bin_s, end)
        pct = tuple(
            100 * th / p if p > 0 else 0.0 for th, p in zip(throttled, periods, strict=True)
        )
        out.append(Series("throttled periods", "%", t, pct))
    return out
