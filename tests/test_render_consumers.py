"""Flame graphs, timeline, exports and the HTML report, checked by the programs that read them."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from profkit.analysis.pipeline import analyse_bundle
from profkit.analysis.stacks import build
from profkit.render.exports import folded, pprof, speedscope
from profkit.render.flame_svg import render_svg
from profkit.render.html_report import render_html
from profkit.render.timeline import render_timeline

from .conftest import DATA, run_profkit
from .consumers import SPEEDSCOPE, browser_page, go_pprof, need_chromium, serve

FANOUT = DATA / "fanout_quota"
SVG_NS = "{http://www.w3.org/2000/svg}"


def frames_of(svg: str) -> dict[str, dict[str, str]]:
    root = ET.fromstring(svg)
    return {
        g.get("id"): dict(g.attrib) for g in root.iter(f"{SVG_NS}g") if g.get("class") == "frame"
    }


def ancestors(frames: dict[str, dict[str, str]], ident: str) -> list[str]:
    names = []
    parent = frames[ident]["data-parent"]
    while parent:
        names.append(frames[parent]["data-name"])
        parent = frames[parent]["data-parent"]
    return names


def test_merged_svg_grafts_the_pool_under_the_copy_and_sums_to_the_process() -> None:
    report = analyse_bundle(FANOUT)
    svg = render_svg(build(report, "merged"), "test")
    frames = frames_of(svg)
    roots = [f for f in frames.values() if not f["data-parent"]]
    assert [r["data-name"] for r in roots] == ["process"]
    process_seconds = report.reconciliation.process_cores * report.reconciliation.window_seconds
    assert float(roots[0]["data-seconds"]) == pytest.approx(process_seconds, rel=0.03)
    pool = [i for i, f in frames.items() if f["data-name"] == "[openmp pool x8]"]
    assert pool, "the pool is grafted"
    above = ancestors(frames, pool[0])
    assert any(re.match(r"copy_with_torch \(shm_fanout\.py:\d+\)", n) for n in above), above
    below = [f for i, f in frames.items() if pool[0] in _chain(frames, i)]
    kinds = {f["data-kind"] for f in below}
    assert {"pool-work", "kernel"} <= kinds, kinds
    assert any("direct_copy_kernel" in f["data-name"] for f in below)


def _chain(frames: dict[str, dict[str, str]], ident: str) -> list[str]:
    chain, parent = [], frames[ident]["data-parent"]
    while parent:
        chain.append(parent)
        parent = frames[parent]["data-parent"]
    return chain


@pytest.mark.parametrize("view", ["python", "workers", "offcpu"])
def test_other_views_render(view: str) -> None:
    report = analyse_bundle(FANOUT)
    frames = frames_of(render_svg(build(report, view), view))
    assert frames
    if view == "python":
        assert all(f["data-name"] != "[openmp pool x8]" for f in frames.values())
    if view == "workers":
        assert any("direct_copy_kernel" in f["data-name"] for f in frames.values())


def test_diff_colours_by_change(tmp_path: Path) -> None:
    out = tmp_path / "diff.svg"
    result = run_profkit("flame", str(FANOUT), "-o", str(out), "--diff", str(DATA / "numpy_copy"))
    assert result.returncode == 0, result.stderr
    fills = re.findall(r'fill="(rgb\([^"]+\))"', out.read_text())
    assert any(f.startswith("rgb(235,") for f in fills), "grown frames are red"
    assert any(f.endswith(",235)") for f in fills), "shrunk frames are blue"


def test_folded_and_pprof_totals_agree_in_go_pprof(tmp_path: Path) -> None:
    stacks = build(analyse_bundle(FANOUT), "merged")
    folded_total_us = sum(int(line.rsplit(" ", 1)[1]) for line in folded(stacks).splitlines())
    path = tmp_path / "profile.pb.gz"
    path.write_bytes(pprof(stacks))
    assert gzip.decompress(path.read_bytes())
    top = go_pprof("-top", str(path))
    match = re.search(r"of ([\d.]+)(ms|s|us|ns) total", top)
    assert match, top
    scale = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}[match.group(2)]
    assert float(match.group(1)) * scale == pytest.approx(folded_total_us, rel=0.01)
    raw = go_pprof("-raw", str(path))
    values = [int(v) for v in re.findall(r"^\s+(\d+): ", raw, re.M)]
    assert sum(values) / 1000 == pytest.approx(folded_total_us, rel=0.001)
    assert "direct_copy_kernel" in raw


def test_svg_and_html_in_chromium(tmp_path: Path) -> None:
    need_chromium()
    report = analyse_bundle(FANOUT)
    (tmp_path / "flame.svg").write_text(render_svg(build(report, "merged"), "merged"))
    (tmp_path / "report.html").write_text(render_html(report))
    with serve(tmp_path) as base, browser_page() as (page, errors):
        for name in ("flame.svg", "report.html"):
            page.goto(f"{base}/{name}")
            page.wait_for_timeout(300)
            matched = page.evaluate("window.profkitSearch('direct_copy_kernel')")
            assert matched > 0
            assert "matched" in page.evaluate("document.getElementById('matched').textContent")
            page.evaluate(
                "window.profkitZoom(document.querySelector('g.frame[data-name^="
                '"[openmp pool"]\').id)'
            )
            hidden = page.evaluate("document.querySelectorAll('g.frame.hidden').length")
            assert hidden > 0, "zooming hides the frames outside the pool"
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=name.endswith(".html"))
            assert (tmp_path / f"{name}.png").stat().st_size > 10_000
        assert errors == []
        if name == "report.html":
            text = page.inner_text("body")
            assert "cpu-fanout" in text and "quota-oversubscription" in text


def _speedscope_site(tmp_path: Path) -> Path:
    if not (SPEEDSCOPE / "index.html").exists():
        pytest.skip("speedscope is not installed (make test installs it with npm)")
    site = tmp_path / "site"
    shutil.copytree(SPEEDSCOPE, site)
    return site


def test_speedscope_imports_export_and_timeline(tmp_path: Path) -> None:
    need_chromium()
    site = _speedscope_site(tmp_path)
    report = analyse_bundle(FANOUT)
    (site / "profile.json").write_text(speedscope(build(report, "merged"), "merged"))
    (site / "trace.json").write_text(render_timeline(report))
    pid = report.bundle.manifest["target"]["pid"]
    with serve(site) as base, browser_page() as (page, errors):
        page.goto(f"{base}/index.html#profileURL={base}/profile.json")
        page.wait_for_selector("text=merged (all threads)", timeout=20_000)
        page.keyboard.press("3")  # the sandwich view lists frames as text
        page.wait_for_timeout(500)
        body = page.inner_text("body")
        assert "direct_copy_kernel" in body and "exc_page_fault" in body
        page.screenshot(path=str(tmp_path / "speedscope.png"))
    with serve(site) as base, browser_page() as (page, errors2):
        page.goto(f"{base}/index.html#profileURL={base}/trace.json")
        page.wait_for_selector("text=(dispatcher)", timeout=20_000)
        page.keyboard.press("3")
        page.wait_for_timeout(500)
        body = page.inner_text("body")
        assert f"python python {pid} (dispatcher)" in body
        assert "parallel region (team 8)" in body and "on-CPU" in body
    assert errors == [] and errors2 == []


def test_cli_writes_every_output(tmp_path: Path) -> None:
    for args, name in ((["flame", "-o"], "f.svg"), (["timeline", "-o"], "t.json")):
        result = run_profkit(args[0], str(FANOUT), args[1], str(tmp_path / name))
        assert result.returncode == 0, result.stderr
    for fmt in ("folded", "speedscope", "pprof"):
        result = run_profkit(
            "export", str(FANOUT), "--format", fmt, "-o", str(tmp_path / f"e.{fmt}")
        )
        assert result.returncode == 0, result.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert {"M", "X", "i", "C"} <= phases
    result = run_profkit("report", str(FANOUT), "--format", "html", "-o", str(tmp_path / "r.html"))
    assert result.returncode == 0 and "<svg" in (tmp_path / "r.html").read_text()
