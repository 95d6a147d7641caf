"""The verdict on real processes: fan-out and oversubscription found, and only where they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..support import RECIPES, run_profkit
from .conftest import Recipe, StartRecipe, attach

pytestmark = pytest.mark.root


def profile(recipe: Recipe, out: Path, *extra: str, duration: float = 5.0) -> dict:
    captured = attach(recipe.pid, out, *extra, duration=duration)
    # The report reads only the bundle: the recipe, which would keep both cores busy through
    # it, is stopped first.
    recipe.stop()
    assert captured.returncode == 0, captured.stderr
    reported = run_profkit("report", str(out), "--format", "json")
    assert reported.returncode == 0, reported.stderr
    return json.loads(reported.stdout)


def line_of(script: str, needle: str) -> int:
    lines = (RECIPES / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def by_id(report: dict) -> dict[str, dict]:
    return {finding["id"]: finding for finding in report["findings"]}


def test_fanout_in_half_a_core(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe(
        "shm_fanout.py", "--copy", "torch", "--threads", "8", cores=0.5, warmup=1.0
    )
    report = profile(recipe, tmp_path / "b", duration=8.0)
    # Default settings: the eBPF walker reads the stack of every region, in the quota too.
    pool = report["pools"][0]
    assert pool["regions_with_stack"] >= 0.99 * pool["regions"] > 0, pool
    findings = by_id(report)
    assert "cpu-fanout" in findings, report["findings"]
    fanout = findings["cpu-fanout"]
    assert fanout["evidence"]["op"] == "aten::copy_"
    copy_line = line_of("shm_fanout.py", "destination.copy_(")
    assert fanout["evidence"]["site"].endswith(f"recipes/shm_fanout.py:{copy_line}")
    assert f"shm_fanout.py:{copy_line}" in fanout["fix"]
    over = findings["quota-oversubscription"]
    assert over["evidence"]["recommended_threads"] == 1
    assert "OMP_NUM_THREADS=1" in over["fix"] and "torch.set_num_threads(1)" in over["fix"]
    assert report["quota"]["effective_cores"] == pytest.approx(0.5)
    cpu = report["cpu"]
    parts = sum(cpu["categories"].values())
    assert abs(parts - cpu["process_cores"]) <= 0.03 * cpu["process_cores"]
    assert cpu["closure_pct"] <= 3.0
    assert report["pools"][0]["workers"] == 7 and report["pools"][0]["team_size"] == 8
    # Under a quota the cgroup sampler reads once per 100-ms period.
    cgroup = json.loads((tmp_path / "b" / "cgroup.json").read_text())
    assert cgroup["interval_s"] == 0.1
    times = cgroup["samples"]["t_ns"]
    assert len(times) >= 0.7 * (times[-1] - times[0]) / 0.1e9


@pytest.mark.parametrize(
    "args", [("--copy", "numpy", "--threads", "8"), ("--copy", "torch", "--threads", "1")]
)
def test_no_fanout_finding_without_fanout(
    start_recipe: StartRecipe, tmp_path: Path, args: tuple[str, ...]
) -> None:
    recipe = start_recipe("shm_fanout.py", *args, warmup=1.0)
    report = profile(recipe, tmp_path / "b", duration=4.0)
    assert "cpu-fanout" not in by_id(report), report["findings"]
    cpu = report["cpu"]
    assert cpu["closure_pct"] <= 3.0


def test_two_call_sites_are_told_apart(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe("two_sites.py", "--threads", "8", warmup=1.0)
    # Default settings: the eBPF walker reads each region's Python stack, so no sampling rate
    # decides whether the site is found.
    report = profile(recipe, tmp_path / "b", duration=6.0)
    rows = [row for row in report["attribution"] if row["pool"] == "openmp"]
    assert rows, report["attribution_notes"]
    shares = {row["function"]: row["share"] for row in rows}
    assert shares.get("copy_fanout", 0.0) >= 0.9, rows
    assert rows[0]["method"] == "stack", rows
    assert by_id(report)["cpu-fanout"]["evidence"]["function"] == "copy_fanout"


def test_two_call_sites_without_the_scheduler_traced(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    # What a busy machine gets: region uprobes, but no sched tracepoints (weights by length).
    recipe = start_recipe("two_sites.py", "--threads", "8", warmup=1.0)
    report = profile(recipe, tmp_path / "b", "--ebpf-sched", "off", duration=6.0)
    ebpf = json.loads((tmp_path / "b" / "ebpf.json").read_text())
    assert ebpf["sched"]["traced"] is False and ebpf["regions"]["tid"]
    assert not any("sched:" in a for a in ebpf["attached"]), ebpf["attached"]
    rows = [row for row in report["attribution"] if row["pool"] == "openmp"]
    assert rows, report["attribution_notes"]
    assert {row["function"]: row["share"] for row in rows}.get("copy_fanout", 0.0) >= 0.9, rows
    notes = [n for n in report["attribution_notes"] if n["pool"] == "openmp"]
    # Weighed by the workers' samples inside the regions (by length with too few of them).
    assert notes[0]["method"] == "stack", notes
    assert "the scheduler was not traced" in notes[0]["reason"], notes


def test_without_native_frames_or_region_probes_the_report_says_why_no_site(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """What a machine without bcc gets where --native costs more than the budget allows."""
    recipe = start_recipe("shm_fanout.py", "--threads", "8", warmup=1.0)
    report = profile(
        recipe,
        tmp_path / "b",
        "--collectors",
        "proc,cgroup,pyspy",
        "--pyspy-mode",
        "nonblocking",
        duration=4.0,
    )
    notes = [n for n in report["attribution_notes"] if n["pool"] == "openmp"]
    assert notes and notes[0]["method"] == "none", report["attribution_notes"]
    assert "--pyspy-mode native" in notes[0]["reason"], notes
    assert "cpu-fanout" in by_id(report), "the pool's CPU is still found without a call site"
