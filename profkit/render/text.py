"""The text report: the verdict first, then the tables that prove it, in 80 columns."""

from __future__ import annotations

import textwrap

from ..analysis.pipeline import Report
from ..bundle.frames import Frame
from .table import table

WIDTH = 80


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _short(label: str, width: int = 30) -> str:
    """The last path components that fit, so that the file name and line always show."""
    parts = label.split("/")
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(kept) > width:
            break
        kept = f"{part}/{kept}"
    return kept


def render_text(report: Report) -> str:
    recon = report.reconciliation
    manifest = report.bundle.manifest
    target = manifest.target
    status = f"window {recon.window_seconds:.1f} s, status {manifest.status}"
    reason = manifest.status_reason
    lines = [
        f"profkit report: pid {target.pid}  {' '.join(target.cmdline)}"[:WIDTH],
        *textwrap.wrap(f"{status} ({reason})" if reason else status, WIDTH),
        "",
    ]
    lines.append("VERDICT")
    if not report.findings:
        lines.append("  no finding: no thread pool burns a significant share of this process")
    for finding in report.findings:
        lines += _wrap(f"[{finding.severity}] {finding.id}: {finding.summary}")
        lines += _wrap(f"fix: {finding.fix}", "      ")
    lines += ["", "WHERE THE CPU GOES (cores; /proc is the ground truth)"]
    cpu_rows = [
        ("process (ground truth)", f"{recon.process_cores:.2f}"),
        ("Python sampled", f"{recon.python_sampled_cores:.2f}"),
        ("  python (interpreted)", f"{recon.python:.2f}"),
        ("  native in python threads", f"{recon.native_in_python_threads:.2f}"),
        ("  pool workers", f"{recon.pool_workers:.2f}"),
        ("  other threads", f"{recon.other:.2f}"),
        ("  unexplained", f"{recon.unexplained_cores:+.2f} ({recon.closure_pct:.1f}%)"),
    ]
    lines.append(table(("", "cores"), cpu_rows))
    sched = report.bundle.sched
    if sched is not None and sched.loader:
        name = "CO-RE" if sched.loader == "core" else sched.loader
        version = f" ({sched.loader_version})" if sched.loader_version else ""
        reason = f": {sched.loader_reason}" if sched.loader_reason else ""
        lines += _wrap(f"eBPF through {name}{version}{reason}")
    if sched is not None and sched.python_interpreter:
        walker = "eBPF walker on" if sched.walker == "on" else "eBPF walker off"
        lines += _wrap(f"{sched.python_interpreter}; {walker}")
    cut = report.cut
    if cut is not None and cut.cut:
        lines += _wrap(
            f"Python stacks cut at {cut.bound_frames} frames: {cut.cut} of {cut.samples} "
            "samples (their outermost frames are under [truncated])"
        )
    for pool in report.pools:
        lines += [
            "",
            f"POOL {pool.pool.name}: {len(pool.pool.workers)} workers (team "
            f"{pool.pool.team_size}), {pool.cores:.2f} cores, {pool.regions} regions",
        ]
        if pool.regions_probed < 1.0:
            lines.append(
                f"  regions counted in the {100 * pool.regions_probed:.0f}% of the window the "
                "probes were on"
            )
        if pool.pool.runtime and "@" in pool.pool.name:
            lines.append(f"  library: {pool.pool.runtime}")
        if pool.region_ms:
            median, p90, longest = pool.region_ms
            lines.append(
                f"  regions last {median:.3g} ms median, {p90:.3g} ms p90, {longest:.3g} ms max"
            )
        if pool.activity and pool.activity.samples:
            shares = "  ".join(f"{k} {100 * v:.0f}%" for k, v in pool.activity.shares.items())
            lines.append(f"  activity ({pool.activity.samples} native samples): {shares}")
            kinds = ", ".join(f"{k} {100 * v:.0f}%" for k, v in pool.activity.kernel_kinds.items())
            if kinds:
                lines.append(f"  kernel: {kinds}")
            if pool.activity.top_work:
                work = ", ".join(f"{s} {100 * v:.0f}%" for s, v in pool.activity.top_work[:3])
                lines += _wrap(f"work: {work}")
        attribution = pool.attribution
        spread = f"±{100 * attribution.uncertainty:.0f}%"
        lines += _wrap(f"dispatched from ({attribution.method}, {spread}): {attribution.reason}")
        if attribution.sites:
            site_rows = [
                (
                    _short(s.site.label, 26),
                    s.site.function[:18],
                    s.op or "?",
                    f"{s.pool_cores:.2f}",
                    f"{100 * s.share:.0f}%",
                )
                for s in attribution.sites[:5]
            ]
            lines.append(
                table(("site", "function", "op", "cores", "share"), site_rows, (26, 14, 20, 5, 5))
            )
            top = attribution.sites[0]
            if top.code:
                lines.append(f"  {_short(top.site.label)}: {top.code}"[:WIDTH])
            # Where the sites are in a library's code, the program's own lines that led there:
            # one line each, naming the sites it led to unless it led to all of them.
            shown = attribution.sites[:5]
            led: dict[Frame, list[str]] = {}
            for s in shown:
                user = s.user
                if user is not None and user.located() != s.site.located():
                    led.setdefault(user, []).append(s.site.function)
            for user, functions in led.items():
                code = f": {user.code}" if user.code else ""
                which = "" if len(functions) == len(shown) else f" ({', '.join(functions)})"
                lines += _wrap(f"from your code: {_short(user.label, 48)}{code}{which}")
    quota = report.quota
    if quota is not None:
        lines += ["", "QUOTA"]
        if quota.effective_cores is None:
            lines.append("  no CPU quota")
        else:
            throttled = quota.throttled_periods_pct
            lines += _wrap(
                f"{quota.effective_cores:g} cores set by {quota.source}; throttled "
                f"{'-' if throttled is None else f'{throttled:.0f}%'} of {quota.periods} periods "
                f"({quota.throttled_seconds:.2f} s held back, summed over CPUs)"
            )
        usage = "-" if quota.usage_cores is None else f"{quota.usage_cores:.2f}"
        lines.append(
            f"  group usage {usage} cores; recommended threads {quota.recommended_threads}"
        )
    lines += ["", "THREADS (top 8 by CPU)"]
    thread_rows = [
        (t.tid, t.name[:15], t.role, t.pool or "", f"{t.cores:.2f}") for t in recon.threads[:8]
    ]
    lines.append(table(("tid", "name", "role", "pool", "cores"), thread_rows))
    if report.missing:
        lines += ["", "NOT CAPTURED"]
        for name, reason in report.missing.items():
            lines += _wrap(f"{name}: {reason}")
    return "\n".join(lines)
