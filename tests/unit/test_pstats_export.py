"""`export --format pstats` read by its real consumers: pstats itself, flameprof (the design's
flame graph package: its SVG must render) and snakeviz's loader."""

from __future__ import annotations

import pstats
import subprocess
import sys
from pathlib import Path
from typing import Protocol, TypeAlias, cast
from xml.etree import ElementTree

import pytest
from snakeviz.stats import json_stats, table_rows

from profkit.analysis.pipeline import analyse_bundle
from profkit.analysis.stacks import VIEWS, build
from profkit.render.exports import pstats as to_pstats
from profkit.render.exports import pstats_key

from ..support import DATA, run_profkit

BUNDLES = sorted(p.name for p in DATA.iterdir() if (p / "manifest.json").exists())
SVG = "{http://www.w3.org/2000/svg}"

# pstats' (file, line, function) and its (calls, primitive calls, own, cumulative) times.
Function: TypeAlias = tuple[str, int, str]
Times: TypeAlias = tuple[int, int, float, float]


class LoadedStats(Protocol):
    """What pstats.Stats sets when it loads a profile, which typeshed does not declare."""

    total_tt: float
    stats: dict[Function, tuple[int, int, float, float, dict[Function, Times]]]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("name", BUNDLES)
def test_pstats_holds_the_views_time(name: str, view: str, tmp_path: Path) -> None:
    stacks = build(analyse_bundle(DATA / name), view)
    path = tmp_path / "view.prof"
    path.write_bytes(to_pstats(stacks))
    stats = cast(LoadedStats, pstats.Stats(str(path)))
    # Own time sums to the view's total; no function's cumulative time exceeds it.
    assert stats.total_tt == pytest.approx(sum(stacks.weights.values()), abs=1e-9)
    table = stats.stats
    assert all(ct <= stats.total_tt + 1e-9 for _, _, _, ct, _ in table.values())
    # A function's cumulative time is the weight of the stacks it appears in, each once.
    expected: dict[tuple[str, int, str], float] = {}
    for stack, seconds in stacks.weights.items():
        if stack and seconds > 0:
            for key in {pstats_key(node) for node in stack}:
                expected[key] = expected.get(key, 0.0) + seconds
    for key, seconds in expected.items():
        assert table[key][3] == pytest.approx(seconds, rel=1e-9), key


def test_flameprof_and_snakeviz_read_it(tmp_path: Path) -> None:
    out = tmp_path / "merged.prof"
    result = run_profkit("export", str(DATA / "two_sites"), "--format", "pstats", "-o", str(out))
    assert result.returncode == 0, result.stderr
    svg = subprocess.run(
        [sys.executable, "-m", "flameprof", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    # It renders: well-formed SVG whose boxes have a size, one of them the call site the merged
    # view grafts the pool under.
    root = ElementTree.fromstring(svg.encode())
    assert root.tag == f"{SVG}svg", root.tag
    # flameprof draws each function as a nested <svg> box holding its rect and title.
    boxes = [b for b in root.iter(f"{SVG}svg") if float(b.get("width", "0")) > 0]
    assert len(boxes) > 3, len(boxes)
    titles = " ".join(t.text or "" for t in root.iter(f"{SVG}title"))
    assert "copy_fanout" in titles, titles[:300]
    stats = pstats.Stats(str(out))
    rows = table_rows(stats)
    assert any("two_sites.py" in row[-1] for row in rows)
    callees = json_stats(stats)
    assert any("copy_fanout" in key and value["children"] for key, value in callees.items())
