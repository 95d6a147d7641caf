"""One self-contained HTML file: verdict, tables, CPU and throttling plots, the flame graph."""

from __future__ import annotations

import html

from ..analysis.pipeline import Report
from ..analysis.stacks import build
from ..analysis.timeseries import Series, series
from .flame_svg import render_svg
from .json_report import AttributionJson, UserFrameJson, report_dict

PLOT_W, PLOT_H = 560, 160
COLOURS = {"process CPU": "#2f80ed", "pool CPU": "#27ae60", "throttled periods": "#eb5757"}


def _plot(items: list[Series], unit: str, title: str) -> str:
    items = [s for s in items if s.unit == unit and s.values]
    if not items:
        return ""
    t_max = max(max(s.t_s) for s in items) or 1.0
    v_max = max(max(s.values) for s in items) or 1.0
    if unit == "%":
        v_max = 100.0
    lines, legend = [], []
    for index, item in enumerate(items):
        points = " ".join(
            f"{40 + t / t_max * (PLOT_W - 50):.1f},{PLOT_H - 20 - v / v_max * (PLOT_H - 40):.1f}"
            for t, v in zip(item.t_s, item.values, strict=True)
        )
        colour = COLOURS.get(item.name, "#555")
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{points}"/>'
        )
        legend.append(
            f'<text x="{50 + index * 150}" y="14" fill="{colour}">{html.escape(item.name)}</text>'
        )
    return (
        f'<figure><svg class="plot" width="{PLOT_W}" height="{PLOT_H}" '
        f'font-size="11" font-family="sans-serif">'
        f'<line x1="40" y1="{PLOT_H - 20}" x2="{PLOT_W - 10}" y2="{PLOT_H - 20}" '
        f'stroke="#999"/><line x1="40" y1="20" x2="40" y2="{PLOT_H - 20}" stroke="#999"/>'
        f'<text x="4" y="24">{v_max:.1f}</text><text x="4" y="{PLOT_H - 20}">0</text>'
        f'<text x="{PLOT_W - 60}" y="{PLOT_H - 4}">{t_max:.1f} s</text>'
        f"{''.join(legend)}{''.join(lines)}</svg><figcaption>{html.escape(title)}"
        f"</figcaption></figure>"
    )


def _table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _user(frame: UserFrameJson | None) -> str:
    if frame is None:
        return ""
    code = f": {frame['code']}" if frame["code"] else ""
    return f"{frame['file']}:{frame['line']}{code}"


def _site_stack(row: AttributionJson) -> str:
    """A site's whole Python stack, outermost first, folded away until asked for."""
    frames = "".join(
        f"<li>{html.escape(f['function'])} <small>{html.escape(f['file'])}:{f['line']}</small></li>"
        for f in row["stack"]
    )
    summary = html.escape(f"{row['function']} ({row['site']}): its whole stack")
    return f"<details><summary>{summary}</summary><ol>{frames}</ol></details>"


def render_html(report: Report) -> str:
    data = report_dict(report)
    cpu = data["cpu"]
    target = data["target"]
    findings = (
        "".join(
            f'<div class="finding {f["severity"]}"><b>[{f["severity"]}] {f["id"]}</b>: '
            f"{html.escape(f['summary'])}<br><i>fix:</i> {html.escape(f['fix'])}</div>"
            for f in data["findings"]
        )
        or "<p>No finding: no pool burns a significant share.</p>"
    )
    categories = cpu["categories"]
    reconciliation = _table(
        ["", "cores"],
        [
            ["process (ground truth)", cpu["process_cores"]],
            ["Python sampled", cpu["python_sampled_cores"]],
            ["python (interpreted)", categories["python"]],
            ["native in python threads", categories["native_in_python_threads"]],
            ["pool workers", categories["pool_workers"]],
            ["other threads", categories["other"]],
            ["unexplained", f"{cpu['unexplained_cores']} ({cpu['closure_pct']}%)"],
        ],
    )
    attribution = _table(
        ["site", "function", "code", "from your code", "op", "pool cores", "share", "method"],
        [
            [
                a["site"],
                a["function"],
                a["code"],
                _user(a["user_frame"]),
                a["op"],
                a["pool_cores"],
                a["share"],
                a["method"],
            ]
            for a in data["attribution"]
        ],
    ) + "".join(_site_stack(a) for a in data["attribution"] if a["stack"])
    notes = "".join(
        f"<p>{html.escape(n['pool'])} ({html.escape(n['method'])}): {html.escape(n['reason'])}</p>"
        for n in data["attribution_notes"]
    )
    pools = _table(
        ["pool", "workers", "team", "cores", "regions", "with Python stack", "activity"],
        [
            [
                p["runtime"],
                p["workers"],
                p["team_size"],
                p["cores"],
                p["regions"],
                p["regions_with_stack"],
                ", ".join(f"{k} {100 * v:.0f}%" for k, v in (p["activity"] or {}).items()),
            ]
            for p in data["pools"]
        ],
    )
    quota = data["quota"]
    quota_rows: list[list[object]] = [] if quota is None else [[k, v] for k, v in quota.items()]
    items = series(report)
    plots = _plot(items, "cores", "process and pool CPU (cores)") + _plot(
        items, "%", "periods throttled by the cgroup quota (%)"
    )
    flame = render_svg(build(report, "merged"), "merged flame graph")
    flame = flame.split("?>", 1)[1] if flame.startswith("<?xml") else flame
    title = f"profkit report: pid {target['pid']}"
    return PAGE.format(
        title=html.escape(title),
        command=html.escape(" ".join(target["cmdline"] or [])),
        window=data["window_seconds"],
        status=html.escape(str(data["status"])),
        findings=findings,
        reconciliation=reconciliation,
        pools=pools,
        attribution=notes + attribution,
        quota=_table(["", ""], quota_rows),
        plots=plots,
        flame=flame,
    )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<link rel="icon" href="data:,">
<style>
 body {{ font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1240px; }}
 table {{ border-collapse: collapse; margin: 0.5em 0 1em; font-size: 13px; }}
 td, th {{ border: 1px solid #ddd; padding: 3px 8px; text-align: left; }}
 .finding {{ padding: 6px 10px; margin: 6px 0; border-left: 5px solid #999; background: #fafafa; }}
 .finding.high {{ border-color: #eb5757; }} .finding.medium {{ border-color: #f2994a; }}
 figure {{ display: inline-block; margin: 0 1em 1em 0; }}
 code {{ background: #f4f4f4; }}
</style></head><body>
<h1>{title}</h1>
<p><code>{command}</code><br>window {window} s, capture {status}</p>
<h2>Verdict</h2>{findings}
<h2>Where the CPU goes</h2>{reconciliation}
<h2>Pools</h2>{pools}
<h2>Dispatch sites</h2>{attribution}
<h2>Quota</h2>{quota}
<h2>Over time</h2>{plots}
<h2>Merged flame graph</h2>
<p>The dispatching Python stack with the pool workers' native stacks grafted under it; width is
CPU time. Hover for details, click to zoom, <i>Search</i> to highlight.</p>
{flame}
</body></html>
"""
