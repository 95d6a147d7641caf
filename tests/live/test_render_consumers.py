"""Flame graphs, timeline and exports read by the real programs that read them: Chromium,
speedscope in Chromium, Go's pprof."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import pytest

from profkit.analysis.pipeline import analyse_bundle
from profkit.analysis.stacks import build
from profkit.render.exports import folded, pprof, speedscope
from profkit.render.flame_svg import render_svg
from profkit.render.html_report import render_html
from profkit.render.timeline import render_timeline

from ..support import DATA
from .consumers import SPEEDSCOPE, browser_page, go_pprof, need_chromium, serve

FANOUT = DATA / "fanout_quota"


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


def test_speedscope_imports_export_and_timeline(tmp_path: Path) -> None:
    need_chromium()
    site = _speedscope_site(tmp_path)
    report = analyse_bundle(FANOUT)
    (site / "profile.json").write_text(speedscope(build(report, "merged"), "merged"))
    (site / "trace.json").write_text(render_timeline(report))
    pid = report.bundle.manifest.target.pid
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


def _speedscope_site(tmp_path: Path) -> Path:
    if not (SPEEDSCOPE / "index.html").exists():
        pytest.skip("speedscope is not installed (make test installs it with npm)")
    site = tmp_path / "site"
    shutil.copytree(SPEEDSCOPE, site)
    return site
