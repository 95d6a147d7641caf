"""Quota over the capture window: budget, usage, throttling and what the pool burns of it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bundle.manifest import QuotaFacts
from ..bundle.read import CgroupSeries
from ..host.cgroup import recommended_threads


@dataclass(frozen=True)
class QuotaUse:
    effective_cores: float | None
    source: str | None
    period_us: int | None
    usage_cores: float | None
    periods: int
    throttled_periods: int
    throttled_seconds: float
    pressure_some_pct: float | None
    recommended_threads: int

    @property
    def throttled_periods_pct(self) -> float | None:
        return None if self.periods <= 0 else 100.0 * self.throttled_periods / self.periods


def quota_use(
    series: CgroupSeries | None,
    window: tuple[int, int],
    cpus_allowed: int,
    manifest_quota: QuotaFacts | None,
) -> QuotaUse | None:
    if series is None or len(series.t_ns) < 2:
        if manifest_quota is None:
            return None
        cores = manifest_quota.effective_cores
        return QuotaUse(
            cores,
            manifest_quota.source,
            manifest_quota.period_us,
            None,
            0,
            0,
            0.0,
            None,
            recommended_threads(cores, cpus_allowed),
        )
    first = int(np.argmin(np.abs(series.t_ns - window[0])))
    last = int(np.argmin(np.abs(series.t_ns - window[1])))
    if last <= first:
        first, last = 0, len(series.t_ns) - 1
    seconds = (series.t_ns[last] - series.t_ns[first]) / 1e9 or 1e-9
    usage = None
    if series.usage_ns[first] >= 0 and series.usage_ns[last] >= 0:
        usage = float(series.usage_ns[last] - series.usage_ns[first]) / 1e9 / seconds
    pressure = None
    if series.pressure_some_us[first] >= 0 and series.pressure_some_us[last] >= 0:
        stalled = series.pressure_some_us[last] - series.pressure_some_us[first]
        pressure = 100.0 * float(stalled) / 1e6 / seconds
    return QuotaUse(
        effective_cores=series.effective_cores,
        source=series.source,
        period_us=series.period_us,
        usage_cores=usage,
        periods=int(series.nr_periods[last] - series.nr_periods[first]),
        throttled_periods=int(series.nr_throttled[last] - series.nr_throttled[first]),
        throttled_seconds=float(series.throttled_ns[last] - series.throttled_ns[first]) / 1e9,
        pressure_some_pct=pressure,
        recommended_threads=recommended_threads(series.effective_cores, cpus_allowed),
    )
