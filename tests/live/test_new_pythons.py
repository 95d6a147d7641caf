"""CPython 3.14 and 3.15 as Debian builds them (libpython inside a non-PIE executable, from
Debian sid, fetched by `make test`'s setup: scripts/fetch_cpython.sh): the eBPF walker reads
them from the layout the interpreter publishes (_Py_DebugOffsets), with no fallback, whole
stacks deep, and the pools get their lines. No torch there: numpy's OpenBLAS pool and libgomp
called through ctypes give the regions."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from profkit.bundle.read import load_bundle
from profkit.host.tools import find_tool

from ..support import ROOT, run_profkit
from .conftest import StartRecipe, attach
from .test_deep_stacks import pool_stacks, reaches_root
from .test_pystacks_live import SITES, assert_sites_exact, line_of, report_of

pytestmark = pytest.mark.root

NEW_PYTHONS = ROOT / ".cache" / "cpython"
VERSIONS = ("3.14", "3.15")


def interpreter(version: str) -> str:
    run = NEW_PYTHONS / version / "run"
    if not run.exists():
        pytest.fail(f"{run} is missing: scripts/setup.sh --test fetches it")
    return str(run)


def assert_walker_on(out: Path, captured: subprocess.CompletedProcess[str], version: str) -> dict:
    assert captured.returncode == 0, captured.stderr
    assert "py-spy samples the Python stacks" not in captured.stderr, captured.stderr
    python = json.loads((out / "ebpf.json").read_text())["python"]
    assert python["walker"] == "on", python.get("reason")
    assert python["full_version"].startswith(version + "."), python
    assert python["build"].startswith("static"), python  # Debian's: in the executable
    assert python["layout"] == "_Py_DebugOffsets", python
    return python


@pytest.mark.parametrize("version", VERSIONS)
def test_openblas_pool_goes_to_its_lines(
    start_recipe: StartRecipe, tmp_path: Path, version: str
) -> None:
    recipe = start_recipe(
        "sites.py",
        *("--pool", "blas", "--rounds-per-s", "10"),
        env={"OPENBLAS_NUM_THREADS": "2"},
        python=interpreter(version),
    )
    out = tmp_path / "b"
    captured = attach(recipe.pid, out, duration=4.0)
    assert_walker_on(out, captured, version)
    report = report_of(out)
    pool = next(p for p in report["pools"] if p["runtime"] == "openblas")
    assert pool["regions"] > 0 and pool["regions_with_stack"] >= 0.95 * pool["regions"], pool
    rows = [r for r in report["attribution"] if r["pool"] == "openblas"]
    lines = {f"recipes/sites.py:{line_of('# ' + s.replace('_', ' '))}" for s in SITES}
    placed = sum(r["share"] for r in rows if any(r["site"].endswith(x) for x in lines))
    assert placed >= 0.9, rows
    text = run_profkit("report", str(out)).stdout
    assert f"Python {version}." in text and "_Py_DebugOffsets" in text, text


@pytest.mark.parametrize("version", VERSIONS)
def test_openmp_three_sites_through_ctypes_deep(
    start_recipe: StartRecipe, tmp_path: Path, version: str
) -> None:
    """libgomp's GOMP_parallel through ctypes from 150 frames down: the regions count 1:2:3
    over whole rounds, each names its site, and every stack reaches the script's <module>."""
    recipe = start_recipe(
        "sites.py",
        *("--pool", "gomp", "--threads", "2", "--rounds-per-s", "40", "--depth", "150"),
        python=interpreter(version),
    )
    out = tmp_path / "b"
    captured = attach(recipe.pid, out, duration=3.0)
    python = assert_walker_on(out, captured, version)
    assert python["counts"]["truncated"] == 0, python["counts"]
    assert_sites_exact(out)
    stacks = pool_stacks(load_bundle(out))
    assert stacks and all(reaches_root(s, "recipes/sites.py") for s in stacks)
    assert min(len(s) for s in stacks) > 150


@pytest.mark.parametrize("version", VERSIONS)
def test_lines_match_pyspy_dump(start_recipe: StartRecipe, tmp_path: Path, version: str) -> None:
    """A thread that stands at one line, 40 calls deep: the eBPF walker's samples of it and
    py-spy's dump of the same process name the same functions at the same lines."""
    recipe = start_recipe("spinner.py", "--depth", "40", python=interpreter(version))
    tool = find_tool("py-spy")
    assert tool.path is not None
    dumped = subprocess.run(
        [tool.path, "dump", "--pid", str(recipe.pid), "--json", "--nonblocking"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert dumped.returncode == 0, dumped.stderr
    main = next(t for t in json.loads(dumped.stdout) if t["os_thread_id"] == recipe.pid)
    theirs = [(f["name"].rsplit(".", 1)[-1], f["line"]) for f in main["frames"]]
    out = tmp_path / "b"
    captured = attach(recipe.pid, out, "--collectors", "ebpf,proc", duration=2.0)
    assert_walker_on(out, captured, version)
    spans = load_bundle(out).pyspy
    assert spans is not None and spans.source == "ebpf"
    mine = Counter(
        int(s)
        for s, tid in zip(spans.stack.tolist(), spans.tid.tolist(), strict=True)
        if tid == recipe.pid
    )
    assert mine, "no sample of the main thread"
    frames = [spans.frames[i] for i in spans.stacks[mine.most_common(1)[0][0]]]
    ours = [(f.function.rsplit(".", 1)[-1], f.line) for f in reversed(frames)]
    assert ours == theirs, (ours[:5], theirs[:5], len(ours), len(theirs))
