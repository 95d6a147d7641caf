"""From a bundle on disk to a Report: pure steps over frozen records, no root needed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..bundle.read import Bundle, load_bundle
from ..errors import BadBundle
from .activity import Activity, pool_activity
from .attribution import Attribution, attribute, native_command, probed_fraction
from .cpu import CpuWindow, cpu_window
from .findings import Finding, blind_spot, fanout, oversubscription, sort_findings, spin
from .reconcile import Reconciliation, reconcile
from .roles import Pool, ThreadRole, classify
from .throttling import QuotaUse, quota_use


@dataclass(frozen=True)
class PoolReport:
    pool: Pool
    cores: float
    regions: int
    activity: Activity | None
    attribution: Attribution
    # Region durations in the window, ms: median, 90th percentile, longest (None: no region
    # ended in it, or no end probe).
    region_ms: tuple[float, float, float] | None = None
    # The fraction of the window the region probes were on (below 1 when switched to fit the
    # budget): `regions` counts only those times.
    regions_probed: float = 1.0


@dataclass(frozen=True)
class Report:
    bundle: Bundle
    cpu: CpuWindow
    roles: tuple[ThreadRole, ...]
    reconciliation: Reconciliation
    pools: tuple[PoolReport, ...]
    quota: QuotaUse | None
    findings: tuple[Finding, ...]
    missing: dict[str, str]
    cut: CutStacks | None = None  # the eBPF walker's samples whose stack it cut at its bound


@dataclass(frozen=True)
class CutStacks:
    """The eBPF walker's samples in the window (the Python threads' and the workers' with their
    dispatcher's stack), how many of them carry a stack cut at the walker's bound, and that
    bound: a cut stack's root is [truncated] in every view."""

    samples: int
    cut: int
    bound_frames: int


def cut_stacks(bundle: Bundle, window: tuple[int, int]) -> CutStacks | None:
    sched = bundle.sched
    if sched is None or not sched.python_stacks:
        return None
    cut = np.array([s.truncated for s in sched.python_stacks] + [False], dtype=bool)
    bound = max((len(s.frames) - 1 for s in sched.python_stacks if s.truncated), default=0)
    samples = cut_count = 0
    own = bundle.pyspy if bundle.pyspy is not None and bundle.pyspy.source == "ebpf" else None
    if own is not None:
        inside = (own.start_ns >= window[0]) & (own.start_ns <= window[1])
        marked = np.array([bool(s) and own.frames[s[0]].is_truncation for s in own.stacks])
        samples += int(inside.sum())
        cut_count += int(marked[own.stack[inside]].sum()) if len(marked) else 0
    dispatched = sched.dispatched
    if dispatched is not None:
        inside = (dispatched.t_ns >= window[0]) & (dispatched.t_ns <= window[1])
        stacks = dispatched.stack[inside & (dispatched.stack >= 0)]
        samples += len(stacks)
        cut_count += int(cut[stacks].sum())
    return CutStacks(samples, cut_count, bound)


def analyse(bundle: Bundle) -> Report:
    status = bundle.manifest.status
    if status in ("aborted", "capturing") and (bundle.proc is None or not any(bundle.window)):
        why = bundle.manifest.status_reason or (
            "profkit is still capturing it, or was killed; the next capture marks it aborted"
        )
        raise BadBundle(f"{bundle.directory} is {status}: {why}; it has no window to analyse")
    if bundle.proc is None:
        raise BadBundle(f"{bundle.directory} has no /proc samples, the CPU ground truth")
    window = bundle.window
    cpu = cpu_window(bundle.proc, window)
    tids = [t.tid for t in cpu.threads]
    busy = {t.tid for t in cpu.threads if t.cpu_seconds / cpu.seconds >= 0.01}
    roles, pools = classify(bundle, tids, {t.tid: t.name for t in cpu.threads}, busy)
    recon = reconcile(
        cpu,
        roles,
        bundle.pyspy,
        (cpu.start_ns, cpu.end_ns),
        bundle.perf,
        bundle.manifest.target.thread_names,
    )
    target = bundle.manifest.target
    quota = quota_use(
        bundle.cgroup,
        (cpu.start_ns, cpu.end_ns),
        target.cpus_allowed or 1,
        bundle.manifest.quota,
    )
    pool_reports = []
    findings: list[Finding] = []
    cpus = target.cpus_allowed or 1
    budget = quota.recommended_threads if quota is not None else cpus
    for pool in pools:
        workers = set(pool.workers)
        activity = pool_activity(bundle.perf, workers, window) if bundle.perf else None
        kernels = [name for name, _ in activity.top_work] if activity else []
        pool_sched = bundle.sched.for_pool(pool.name) if bundle.sched is not None else None
        attribution = attribute(
            bundle.pyspy,
            pool_sched,
            set(pool.dispatchers),
            workers,
            cpu.cores_of(workers),
            window,
            kernels,
            bundle.perf,
            native_command(target.pid, bundle.manifest.native_budget),
        )
        regions, region_ms, probed = 0, None, 1.0
        if pool_sched is not None:
            probed = probed_fraction(pool_sched, window)
            starts, ends = pool_sched.region_start, pool_sched.region_end
            inside = (starts >= window[0]) & (starts <= window[1])
            regions = int(inside.sum())
            durations = (ends - starts)[inside & (ends > starts)] / 1e6
            if len(durations):
                median, p90 = np.percentile(durations, [50, 90])
                region_ms = (float(median), float(p90), float(durations.max()))
        pool_reports.append(
            PoolReport(
                pool, cpu.cores_of(workers), regions, activity, attribution, region_ms, probed
            )
        )
        for finding in (
            fanout(_pool_recon(recon, pool, cpu), pool, activity, attribution, budget),
            oversubscription(
                pool.team_size,
                f"{len(pool.workers)} workers seen + the dispatcher",
                cpu.cores_of(workers),
                quota,
            ),
            spin(pool, activity, _pool_recon(recon, pool, cpu)),
        ):
            if finding:
                findings.append(finding)
    blind = bundle.perf is None and (bundle.sched is None or not bundle.sched.scheduler_traced)
    if blind and not any(p.pool.kind == "openmp" for p in pool_reports):
        # No native collector ran, so a pool could not be seen: judge by the pool the runtime
        # is set to. (With perf or eBPF, seeing no worker means the team is one thread.)
        configured = target.pool_threads or 0
        source = f"configured: {target.pool_threads_source or 'unknown'}"
        finding = (
            oversubscription(configured, source, 0.0, quota) if target.openmp_runtime else None
        )
        if finding:
            findings.append(finding)
    extra = blind_spot(recon)
    if extra:
        findings.append(extra)
    return Report(
        bundle,
        cpu,
        roles,
        recon,
        tuple(pool_reports),
        quota,
        sort_findings(findings),
        bundle.missing(),
        cut_stacks(bundle, window),
    )


def _pool_recon(recon: Reconciliation, pool: Pool, cpu: CpuWindow) -> Reconciliation:
    """The reconciliation with pool_workers narrowed to one pool, for per-pool findings."""
    from dataclasses import replace

    return replace(recon, pool_workers=cpu.cores_of(set(pool.workers)))


def analyse_bundle(directory: Path | str) -> Report:
    return analyse(load_bundle(directory))
