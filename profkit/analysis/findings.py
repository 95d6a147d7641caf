"""Findings: each with evidence numbers and a fix computed from that evidence (docs/findings.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .activity import Activity
from .attribution import Attribution, SiteShare
from .reconcile import Reconciliation
from .roles import Pool
from .throttling import QuotaUse

# A pool is a fan-out problem when its workers burn a real share of the process's CPU.
FANOUT_MIN_CORES = 0.05
FANOUT_MIN_SHARE = 0.15
THROTTLE_MIN_PCT = 10.0
BLIND_SPOT_MAX = 0.5
SPIN_MIN_SHARE = 0.3


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # "high", "medium", "low"
    summary: str
    evidence: dict[str, object] = field(hash=False)
    fix: str


def fanout(
    recon: Reconciliation,
    pool: Pool,
    activity: Activity | None,
    attribution: Attribution,
    budget_threads: int,
) -> Finding | None:
    """A pool burning CPU is a problem when it is larger than the CPU budget can run, or when
    its workers mostly spin; a pool that fits the budget and works is parallelism doing its job."""
    share = recon.pool_workers / recon.process_cores if recon.process_cores else 0.0
    if recon.pool_workers < FANOUT_MIN_CORES or share < FANOUT_MIN_SHARE:
        return None
    # Spin makes a finding for OpenMP pools only, whose fix (the pool's size, its wait
    # policy) the verdict knows how to give; OpenBLAS's idle loop shows in the activity line.
    spinning = bool(
        pool.kind == "openmp"
        and activity
        and activity.samples
        and activity.shares.get("spin", 0.0) >= SPIN_MIN_SHARE
    )
    if pool.team_size <= budget_threads and not spinning:
        return None
    sites = attribution.sites
    top = sites[0] if sites else None
    where = ""
    if sites:
        named = ", ".join(
            f"{s.op or 'an unnamed op'} at {s.site.label} ({s.site.function}, {100 * s.share:.0f}%)"
            for s in sites[:3]
        )
        where = f"; dispatched by {named}"
    evidence: dict[str, object] = {
        "pool": pool.name,
        "workers": len(pool.workers),
        "team_size": pool.team_size,
        "pool_cores": round(recon.pool_workers, 3),
        "process_cores": round(recon.process_cores, 3),
        "pool_share_of_process": round(share, 3),
        "python_sampled_cores": round(recon.python_sampled_cores, 3),
        "budget_threads": budget_threads,
    }
    if activity is not None and activity.samples:
        evidence["activity"] = {k: round(v, 3) for k, v in activity.shares.items()}
    if top:
        evidence.update(
            {
                "site": top.site.label,
                "function": top.site.function,
                "op": top.op,
                "site_share": round(top.share, 3),
                "attribution": attribution.method,
                "sites": [
                    {
                        "site": s.site.label,
                        "function": s.site.function,
                        "op": s.op,
                        "share": round(s.share, 3),
                    }
                    for s in sites[:5]
                ],
            }
        )
    fix = fanout_fix(sites)
    severity = "high" if share >= 0.5 else "medium"
    summary = (
        f"{len(pool.workers)} {pool.name} workers burned {recon.pool_workers:.2f} of the "
        f"process's {recon.process_cores:.2f} cores, which a Python sampler such as py-spy does"
        f" not see (Python samples explain {recon.python_sampled_cores:.2f}){where}"
    )
    return Finding("cpu-fanout", severity, summary, evidence, fix)


def byte_copy(site: SiteShare) -> bool:
    """Whether the site is a copy that a numpy view can do: aten::copy_ is also the kernel of a
    dtype or layout conversion (.to(), .float(), .contiguous()), which no byte write replaces,
    so the line must call copy_() itself (or not have been read)."""
    return site.op == "aten::copy_" and (site.code is None or "copy_(" in site.code)


def fanout_fix(sites: tuple[SiteShare, ...]) -> str:
    """The fix for a pool that fans out, from its sites (largest share first)."""
    top = sites[0] if sites else None
    copy_site = next((s for s in sites if byte_copy(s)), None)
    if top is None:
        return "cap the intra-op pool (OMP_NUM_THREADS / torch.set_num_threads)"
    if copy_site is top:
        return (
            f"at {top.site.label}, copy without the intra-op pool: write the bytes through a "
            "numpy view (shm.buf[:] = tensor.detach().view(torch.uint8).reshape(-1).numpy()),"
            " or run this copy under torch.set_num_threads(1); a process-wide thread cap "
            "also works but slows every other op"
        )
    fix = (
        f"several sites fan out ({top.op or 'an op'} at {top.site.label} the most): cap "
        "the intra-op pool for the process (OMP_NUM_THREADS / torch.set_num_threads), "
        "or run the hot calls under torch.set_num_threads(1)"
    )
    if copy_site is not None:
        fix += (
            f"; the copy at {copy_site.site.label} can also go through a numpy view "
            "instead of Tensor.copy_()"
        )
    return fix


def oversubscription(
    team_size: int, team_source: str, pool_cores: float, quota: QuotaUse | None
) -> Finding | None:
    """A pool larger than the quota can keep running; pool_cores is 0 when no pool was seen."""
    if quota is None or quota.effective_cores is None:
        return None
    throttled = quota.throttled_periods_pct or 0.0
    cap = quota.recommended_threads
    if team_size <= cap or (
        throttled < THROTTLE_MIN_PCT and pool_cores < 0.25 * quota.effective_cores
    ):
        return None
    burn = pool_cores / quota.effective_cores
    evidence: dict[str, object] = {
        "team_size": team_size,
        "team_size_source": team_source,
        "effective_cores": quota.effective_cores,
        "source": quota.source,
        "throttled_periods_pct": round(throttled, 1),
        "throttled_seconds": round(quota.throttled_seconds, 3),
        "pool_share_of_quota": round(burn, 3),
        "recommended_threads": cap,
    }
    if quota.usage_cores is not None:
        evidence["usage_cores"] = round(quota.usage_cores, 3)
    burns = f", and the pool burns {100 * burn:.0f}% of the budget" if pool_cores else ""
    summary = (
        f"a team of {team_size} threads ({team_source}) runs in a "
        f"{quota.effective_cores:g}-core quota ({quota.source}): {throttled:.0f}% of "
        f"periods throttled{burns}"
    )
    fix = (
        f"cap the pool at floor({quota.effective_cores:g}) = {cap}: OMP_NUM_THREADS={cap} in the"
        f" target's environment before it starts, or torch.set_num_threads({cap}) at start-up"
        " (profkit run --cap-threads does this from the quota)"
    )
    severity = "high" if throttled >= 50 else "medium"
    return Finding("quota-oversubscription", severity, summary, evidence, fix)


def blind_spot(recon: Reconciliation) -> Finding | None:
    if (
        recon.process_cores < 0.2
        or recon.python_sampled_cores >= BLIND_SPOT_MAX * recon.process_cores
    ):
        return None
    missing = recon.process_cores - recon.python_sampled_cores
    return Finding(
        "python-blind-spot",
        "low",
        f"Python samples explain {recon.python_sampled_cores:.2f} of "
        f"{recon.process_cores:.2f} cores; {missing:.2f} cores run in threads a Python sampler "
        "cannot see",
        {
            "python_sampled_cores": round(recon.python_sampled_cores, 3),
            "process_cores": round(recon.process_cores, 3),
        },
        "profile native threads too (this report's pool and thread tables show where)",
    )


def spin(pool: Pool, activity: Activity | None, recon: Reconciliation) -> Finding | None:
    if activity is None or activity.samples < 20 or recon.pool_workers < FANOUT_MIN_CORES:
        return None
    share = activity.shares.get("spin", 0.0)
    if share < SPIN_MIN_SHARE or pool.kind != "openmp":
        return None
    return Finding(
        "pool-spin",
        "medium",
        f"{100 * share:.0f}% of the {pool.name} workers' samples spin or wait in the runtime's "
        "barrier instead of working",
        {"spin_share": round(share, 3), "samples": activity.samples},
        "fewer threads per region (see cpu-fanout), or OMP_WAIT_POLICY=passive so idle workers "
        "sleep instead of spinning",
    )


SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


def sort_findings(findings: list[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity]))
