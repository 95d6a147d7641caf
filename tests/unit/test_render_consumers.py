"""Flame graphs, timeline, exports and the HTML report, checked by the programs that read them."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from profkit.analysis.pipeline import analyse_bundle
from profkit.analysis.stacks import build
from profkit.render.flame_svg import render_svg

from ..support import DATA, run_profkit

FANOUT = DATA / "fanout_quota"
SVG_NS = "{http://www.w3.org/2000/svg}"


def frames_of(svg: str) -> dict[str, dict[str, str]]:
    root = ET.fromstring(svg)
    return {
        g.attrib["id"]: dict(g.attrib) for g in root.iter(f"{SVG_NS}g") if g.get("class") == "frame"
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
