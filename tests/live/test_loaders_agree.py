"""bcc and the CO-RE object run one program, made from one source: captured through each loader,
one target gives every table the reader turns into the bundle, with the same columns and the
same content where the target fixes it (the sites and their 1:2:3 regions, the walker's stacks,
the threads the scheduler sees), and each says what its programs cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recipes.launch import attach_args

from ..support import run_profkit, stale_uprobe_events
from .conftest import StartRecipe
from .test_pystacks_live import SITES, rounds_and_edges

pytestmark = pytest.mark.root


def capture(pid: int, loader: str, out: Path) -> dict[str, Any]:
    done = run_profkit(
        *attach_args(pid, duration=3, out=out, report=False),
        *("--collectors", "ebpf,proc", "--budget", "100", "--ebpf-sched", "on"),
        *("--ebpf-loader", loader),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    ebpf: dict[str, Any] = json.loads((out / "ebpf.json").read_text())
    assert ebpf["loader"]["name"] == loader
    return ebpf


def region_stacks(ebpf: dict[str, Any]) -> set[tuple[str, ...]]:
    stacks = ebpf["python"]["stacks"]
    return {
        tuple(f["function"] for f in stacks[i]["frames"])
        for i in ebpf["regions"]["stack"]
        if i >= 0
    }


def test_both_loaders_give_every_table_alike(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe("sites.py", "--pool", "torch", "--threads", "2", "--rounds-per-s", "30")
    found = {loader: capture(recipe.pid, loader, tmp_path / loader) for loader in ("bcc", "core")}
    bcc, core = found["bcc"], found["core"]
    # The same parts, each with the same columns.
    assert set(bcc) == set(core)
    for part in ("regions", "slices"):
        assert set(bcc[part]) == set(core[part]), part
        for ebpf in (bcc, core):
            assert all(len(column) > 0 for column in ebpf[part].values()), (part, ebpf["loader"])
    for part in ("samples", "dispatched", "offcpu"):
        assert set(bcc["python"][part]) == set(core["python"][part]), part
        for ebpf in (bcc, core):
            assert ebpf["python"][part]["tid"], (part, ebpf["loader"]["name"])
    # The regions: the sites in 1:2:3 over whole rounds, every one with the same stacks.
    for loader in ("bcc", "core"):
        whole, _ = rounds_and_edges(tmp_path / loader)
        rounds = whole["site_one"]
        assert rounds > 5 and whole == {s: w * rounds for s, w in SITES.items()}, (loader, whole)
    assert region_stacks(bcc) == region_stacks(core)
    assert all(stack[-1] in SITES for stack in region_stacks(core))
    # The walker's own outcomes: every region walked, none failed.
    for ebpf in (bcc, core):
        counts = ebpf["python"]["counts"]
        assert counts["walked"] > 0 and counts["read_failures"] == 0, counts
    # The scheduler: the target's threads, each with on-CPU time, and their wakeups.
    tids = [set(ebpf["threads"]) for ebpf in (bcc, core)]
    assert str(recipe.pid) in tids[0] & tids[1]
    for ebpf in (bcc, core):
        main = ebpf["threads"][str(recipe.pid)]
        assert main["oncpu_ns"] > 0 and main["voluntary"] + main["involuntary"] > 0, main
        assert ebpf["wakeups"], ebpf["loader"]
        assert ebpf["histogram_us_log2"], ebpf["loader"]
    # The native stacks the sampler took, named from torch's symbol tables (bcc's cache, or
    # profkit's reader under CO-RE): the copy's code under the pool's workers.
    for loader in ("bcc", "core"):
        native = json.loads((tmp_path / loader / "native.json").read_text())
        named = {name for name, dso in native["frames"] if "libtorch_cpu" in dso}
        assert native["samples"]["t_ns"] and named - {"[unknown]"}, (loader, native["frames"])
    # What each program cost, measured as it ran.
    for ebpf in (bcc, core):
        programs = ebpf["costs"]["programs"]
        assert ebpf["costs"]["stats"] == "on" and ebpf["costs"]["region_us"] > 0
        entries = [p for name, p in programs.items() if "entry" in name]
        assert entries and all(p["runs"] > 0 and p["ns_per_run"] > 0 for p in entries), programs
        assert any("switch" in name for name in programs), programs
    assert stale_uprobe_events() == []
