"""The JSON report: a stable, versioned contract (docs/report-schema.md)."""

from __future__ import annotations

import json

from ..analysis.pipeline import Report

REPORT_SCHEMA_VERSION = 1


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def report_dict(report: Report) -> dict[str, object]:
    manifest = report.bundle.manifest
    target = manifest.get("target", {})
    recon = report.reconciliation
    quota = report.quota
    openmp = next((p for p in report.pools if p.pool.name == "openmp"), None)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "bundle": str(report.bundle.directory),
        "status": manifest.get("status"),
        "target": {
            "pid": target.get("pid"),
            "cmdline": target.get("cmdline"),
            "threads": len(report.cpu.threads),
            "openmp_runtime": target.get("openmp_runtime"),
            "torch_threads": openmp.pool.team_size if openmp else target.get("pool_threads"),
            "torch_version": target.get("torch_version"),
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
    }


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2)
