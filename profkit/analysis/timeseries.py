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
    t_ns: np.ndarray, counter: np.ndarray, start: int, scale: float, bin_s: float
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-bin rate of a cumulative counter sampled at t_ns."""
    if len(t_ns) < 2:
        return (), ()
    edges = np.arange(t_ns[0], t_ns[-1] + 1, int(bin_s * 1e9))
    if len(edges) < 2:
        edges = np.array([t_ns[0], t_ns[-1]])
    values = np.interp(edges, t_ns, counter)
    rates = np.diff(values) / (np.diff(edges) / 1e9) * scale
    mids = ((edges[:-1] + edges[1:]) / 2 - start) / 1e9
    return tuple(float(m) for m in mids), tuple(float(r) for r in rates)


def series(report: Report, bin_s: float = 0.5) -> list[Series]:
    bundle, out = report.bundle, []
    start = report.cpu.start_ns
    proc = bundle.proc
    if proc is not None:
        ticks = float(proc.clock_ticks)
        t, v = _rate(proc.process_t_ns, proc.process_ticks.astype(float), start, 1 / ticks, bin_s)
        out.append(Series("process CPU", "cores", t, v))
        workers = {w for p in report.pools for w in p.pool.workers}
        if workers:
            times = np.unique(proc.t_ns)
            total = np.zeros(len(times))
            for tid in workers:
                rows = proc.tid == tid
                total += (
                    np.interp(times, proc.t_ns[rows], proc.cpu_ticks[rows].astype(float), left=0.0)
                    if rows.any()
                    else 0.0
                )
            t, v = _rate(times, total, start, 1 / ticks, bin_s)
            out.append(Series("pool CPU", "cores", t, v))
    cg = bundle.cgroup
    if cg is not None and len(cg.t_ns) > 1 and cg.effective_cores is not None:
        edges = np.arange(cg.t_ns[0], cg.t_ns[-1] + 1, int(bin_s * 1e9))
        periods = np.diff(np.interp(edges, cg.t_ns, cg.nr_periods.astype(float)))
        throttled = np.diff(np.interp(edges, cg.t_ns, cg.nr_throttled.astype(float)))
        pct = np.where(periods > 0, 100 * throttled / np.maximum(periods, 1e-9), 0.0)
        mids = ((edges[:-1] + edges[1:]) / 2 - start) / 1e9
        out.append(
            Series("throttled periods", "%", tuple(map(float, mids)), tuple(map(float, pct)))
        )
    return out
