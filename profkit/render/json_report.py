"""The JSON report: a stable, versioned contract (docs/report-schema.md)."""

from __future__ import annotations

import json
from typing import TypedDict, overload

from ..analysis.pipeline import Report
from ..bundle.frames import Frame

REPORT_SCHEMA_VERSION = 1


# The report's shape, as docs/report-schema.md lists it.
class TargetJson(TypedDict):
    pid: int | None
    cmdline: list[str] | None
    threads: int
    openmp_runtime: str | None
    torch_threads: int | None
    torch_version: str | None


class CategoriesJson(TypedDict):
    python: float
    native_in_python_threads: float
    pool_workers: float
    other: float


class ThreadJson(TypedDict):
    tid: int
    name: str
    role: str
    pool: str | None
    cores: float


class CpuJson(TypedDict):
    process_cores: float
    python_sampled_cores: float
    categories: CategoriesJson
    unexplained_cores: float
    closure_pct: float
    threads: list[ThreadJson]


class WorkJson(TypedDict):
    symbol: str
    share: float


class PoolJson(TypedDict):
    runtime: str
    library: str | None
    workers: int
    team_size: int
    dispatchers: list[int]
    cores: float
    regions: int
    regions_with_stack: int
    regions_probed: float
    region_ms: dict[str, float | None] | None
    activity: dict[str, float] | None
    kernel_kinds: dict[str, float] | None
    top_work: list[WorkJson]


class FrameJson(TypedDict):
    file: str
    function: str
    line: int


class UserFrameJson(TypedDict):
    file: str
    function: str
    line: int
    code: str | None


class CutStacksJson(TypedDict):
    samples: int
    cut: int
    bound_frames: int


class AttributionJson(TypedDict):
    pool: str
    site: str
    function: str
    code: str | None
    op: str | None
    op_source: str
    pool_cores: float
    share: float
    regions: int
    samples: int
    method: str
    uncertainty: float
    stack: list[FrameJson]
    user_frame: UserFrameJson | None


class NoteJson(TypedDict):
    pool: str
    method: str
    reason: str
    labelled_share: float


class QuotaJson(TypedDict):
    effective_cores: float | None
    source: str | None
    period_us: int | None
    throttled_periods_pct: float | None
    throttled_seconds: float
    usage_cores: float | None
    pressure_some_pct: float | None
    recommended_threads: int


class FindingJson(TypedDict):
    id: str
    severity: str
    summary: str
    evidence: dict[str, object]
    fix: str


class ReportJson(TypedDict):
    schema_version: int
    bundle: str
    status: str | None
    target: TargetJson
    window_seconds: float
    cpu: CpuJson
    pools: list[PoolJson]
    attribution: list[AttributionJson]
    attribution_notes: list[NoteJson]
    quota: QuotaJson | None
    findings: list[FindingJson]
    not_captured: dict[str, str]
    python_stacks_cut: CutStacksJson | None
    python_interpreter: str | None


@overload
def _r(value: float, digits: int = 3) -> float: ...
@overload
def _r(value: float | None, digits: int = 3) -> float | None: ...
def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def report_dict(report: Report) -> ReportJson:
    manifest = report.bundle.manifest
    target = manifest.target
    recon = report.reconciliation
    quota = report.quota
    openmp = next((p for p in report.pools if p.pool.name == "openmp"), None)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "bundle": str(report.bundle.directory),
        "status": manifest.status,
        "target": {
            "pid": target.pid,
            "cmdline": list(target.cmdline),
            "threads": len(report.cpu.threads),
            "openmp_runtime": target.openmp_runtime,
            "torch_threads": openmp.pool.team_size if openmp else target.pool_threads,
            "torch_version": target.torch_version,
        },
        "window_seconds": _r(recon.window_seconds),
        "cpu": {
            "process_cores": _r(recon.process_cores),
            "python_sampled_cores": _r(recon.python_sampled_cores),
            "categories": {
                "python": _r(recon.python),
                "native_in_python_threads": _r(recon.native_in_python_threads),
                "pool_workers": _r(recon.pool_workers),
                "other": _r(recon.other),
            },
            "unexplained_cores": _r(recon.unexplained_cores),
            "closure_pct": _r(recon.closure_pct, 2),
            "threads": [
                {"tid": t.tid, "name": t.name, "role": t.role, "pool": t.pool, "cores": _r(t.cores)}
                for t in recon.threads
            ],
        },
        "pools": [
            {
                "runtime": p.pool.name,
                "library": p.pool.runtime,
                "workers": len(p.pool.workers),
                "team_size": p.pool.team_size,
                "dispatchers": list(p.pool.dispatchers),
                "cores": _r(p.cores),
                "regions": p.regions,
                "regions_with_stack": p.attribution.regions_with_stack,
                "regions_probed": _r(p.regions_probed),
                "region_ms": (
                    dict(zip(("median", "p90", "max"), map(_r, p.region_ms), strict=True))
                    if p.region_ms
                    else None
                ),
                "activity": (
                    {k: _r(v) for k, v in p.activity.shares.items()}
                    if p.activity and p.activity.samples
                    else None
                ),
                "kernel_kinds": (
                    {k: _r(v) for k, v in p.activity.kernel_kinds.items()} if p.activity else None
                ),
                "top_work": (
                    [{"symbol": s, "share": _r(v)} for s, v in p.activity.top_work]
                    if p.activity
                    else []
                ),
            }
            for p in report.pools
        ],
        "attribution": [
            {
                "pool": p.pool.name,
                "site": s.site.label,
                "function": s.site.function,
                "code": s.code,
                "op": s.op,
                "op_source": s.op_source,
                "pool_cores": _r(s.pool_cores),
                "share": _r(s.share),
                "regions": s.regions,
                "samples": s.samples,
                "method": p.attribution.method,
                "uncertainty": _r(p.attribution.uncertainty),
                "stack": [
                    {"file": f.file, "function": f.function, "line": f.line} for f in s.stack
                ],
                "user_frame": _user_frame(s.user),
            }
            for p in report.pools
            for s in p.attribution.sites
        ],
        "attribution_notes": [
            {
                "pool": p.pool.name,
                "method": p.attribution.method,
                "reason": p.attribution.reason,
                "labelled_share": _r(p.attribution.labelled_share),
            }
            for p in report.pools
        ],
        "quota": None
        if quota is None
        else {
            "effective_cores": quota.effective_cores,
            "source": quota.source,
            "period_us": quota.period_us,
            "throttled_periods_pct": _r(quota.throttled_periods_pct, 1),
            "throttled_seconds": _r(quota.throttled_seconds),
            "usage_cores": _r(quota.usage_cores),
            "pressure_some_pct": _r(quota.pressure_some_pct, 1),
            "recommended_threads": quota.recommended_threads,
        },
        "findings": [
            {
                "id": f.id,
                "severity": f.severity,
                "summary": f.summary,
                "evidence": f.evidence,
                "fix": f.fix,
            }
            for f in report.findings
        ],
        "not_captured": report.missing,
        "python_interpreter": (
            report.bundle.sched.python_interpreter or None if report.bundle.sched else None
        ),
        "python_stacks_cut": None
        if report.cut is None
        else {
            "samples": report.cut.samples,
            "cut": report.cut.cut,
            "bound_frames": report.cut.bound_frames,
        },
    }


def _user_frame(frame: Frame | None) -> UserFrameJson | None:
    if frame is None:
        return None
    return {"file": frame.file, "function": frame.function, "line": frame.line, "code": frame.code}


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2)
