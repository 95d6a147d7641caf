"""`profkit quota`: a target's effective CPU quota, its throttling and the pool it can afford."""

from __future__ import annotations

import json

import click

from ..errors import UsageError
from ..host.cgroup import cpu_cgroup, measure
from ..host.quota import QuotaDiagnosis, diagnose
from ..host.target import ensure_same, inspect, pool_threads
from .options import Number, json_option, pid_option


@click.command()
@pid_option
@click.option(
    "--window",
    type=Number(float, 0, 3600, unit=" s"),
    default=2.0,
    show_default=True,
    help="Seconds over which usage and throttling are measured (0: limits only).",
)
@json_option
def quota(pid: int, window: float, as_json: bool) -> None:
    """Diagnose the CPU quota of a process and the thread pool it can afford."""
    if window < 0:
        raise UsageError(f"--window must be >= 0, got {window}")
    target = inspect(pid)
    cg = cpu_cgroup(pid)
    measured = measure(cg, window) if window > 0 else None
    ensure_same(target)
    pool, pool_source = pool_threads(target)
    report = diagnose(cg, measured, target.cpus_allowed, pool, pool_source)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(render_text(pid, report))


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def render_text(pid: int, report: QuotaDiagnosis) -> str:
    quota_text = (
        "unlimited"
        if report.effective_cores is None
        else f"{report.effective_cores:g} cores (set by {report.source})"
    )
    lines = [
        f"pid {pid}  cgroup {report.cgroup} ({report.version})",
        f"  effective quota     {quota_text}",
    ]
    for limit in report.limits:
        lines.append(
            f"    limit at {limit['cgroup']}: {limit['quota_us']}/{limit['period_us']} us"
            f" = {limit['cores']:g} cores"
        )
    lines.append(f"  visible CPUs        {report.cpus_allowed}")
    if report.window_seconds is not None:
        lines += [
            f"  usage               {_fmt(report.usage_cores)} cores over "
            f"{report.window_seconds:.1f} s",
            f"  throttled periods   {_fmt(report.throttled_periods_pct, '%', 1)} "
            f"({report.throttled_periods}/{report.periods})",
            f"  throttled time      {_fmt(report.throttled_seconds, ' s', 3)}",
        ]
        if report.pressure_some_pct is not None:
            lines.append(f"  cpu.pressure some   {_fmt(report.pressure_some_pct, '%', 1)}")
    lines += [
        f"  pool threads        {report.pool_threads} ({report.pool_threads_source})",
        f"  recommended threads {report.recommended_threads}",
        ("OVERSUBSCRIBED: " if report.oversubscribed else "ok: ") + report.advice,
    ]
    return "\n".join(lines)
