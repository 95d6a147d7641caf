"""The quota diagnosis shared by `profkit quota`, attach's manifest and the analysis."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .cgroup import CgroupCpu, QuotaWindow, recommended_threads


@dataclass(frozen=True)
class QuotaDiagnosis:
    version: str
    cgroup: str
    effective_cores: float | None
    source: str | None
    period_us: int | None
    limits: list[dict[str, object]]
    cpus_allowed: int
    window_seconds: float | None
    usage_cores: float | None
    periods: int | None
    throttled_periods: int | None
    throttled_periods_pct: float | None
    throttled_seconds: float | None
    pressure_some_pct: float | None
    bursts: int | None
    burst_seconds: float | None
    pool_threads: int
    pool_threads_source: str
    recommended_threads: int
    oversubscribed: bool
    advice: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def diagnose(
    cg: CgroupCpu, window: QuotaWindow | None, cpus_allowed: int, pool: int, pool_source: str
) -> QuotaDiagnosis:
    limit = cg.effective
    recommended = recommended_threads(cg.effective_cores, cpus_allowed)
    oversubscribed = pool > recommended
    budget = (
        f"{limit.cores:g}-core quota set by {limit.cgroup}"
        if limit
        else f"{cpus_allowed} visible CPUs and no quota"
    )
    if oversubscribed:
        advice = (
            f"the pool ({pool} threads, from {pool_source}) is larger than the "
            f"{budget}: cap it at {recommended} with OMP_NUM_THREADS={recommended} in the "
            f"target's environment, or torch.set_num_threads({recommended}) at start-up"
        )
    else:
        advice = f"the pool ({pool} threads) fits the {budget}"
    return QuotaDiagnosis(
        version=cg.version,
        cgroup=cg.cgroup,
        effective_cores=cg.effective_cores,
        source=limit.cgroup if limit else None,
        period_us=limit.period_us if limit else None,
        limits=[
            {
                "cgroup": lim.cgroup,
                "cores": lim.cores,
                "quota_us": lim.quota_us,
                "period_us": lim.period_us,
            }
            for lim in cg.limits
        ],
        cpus_allowed=cpus_allowed,
        window_seconds=window.seconds if window else None,
        usage_cores=window.usage_cores if window else None,
        periods=window.periods if window else None,
        throttled_periods=window.throttled_periods if window else None,
        throttled_periods_pct=window.throttled_periods_pct if window else None,
        throttled_seconds=window.throttled_seconds if window else None,
        pressure_some_pct=window.pressure_some_pct if window else None,
        bursts=window.bursts if window else None,
        burst_seconds=window.burst_seconds if window else None,
        pool_threads=pool,
        pool_threads_source=pool_source,
        recommended_threads=recommended,
        oversubscribed=oversubscribed,
        advice=advice,
    )
