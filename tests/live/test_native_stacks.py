"""The default capture takes native stacks from the eBPF walker's sampler, not from perf record:
the workers' kernels, the kernel's own frames and the ATen op come out as perf record gave them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from profkit.bundle.read import load_bundle
from profkit.capture.ebpf.native import KERNEL_DSO

from ..support import ROOT, run_profkit
from .conftest import Captured, Recipe, StartRecipe, attach
from .copy_kernel import copy_kernel_samples, inside_regions, probed

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def default_capture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """One default capture of the fan-out recipe (8 threads), shared by the tests below."""
    from .conftest import _start

    out = tmp_path_factory.mktemp("native") / "bundle"
    recipe: Recipe = _start(
        [str(ROOT / "recipes/shm_fanout.py"), "--copy", "torch", "--threads", "8"], None, None
    )
    time.sleep(1.0)
    result = attach(recipe.pid, out, "--ebpf-sched", "on")
    recipe.stop()
    assert result.returncode == 0, result.stderr
    yield out, recipe


def test_no_perf_record_and_every_thread_sampled(default_capture: Captured) -> None:
    out, recipe = default_capture
    manifest = json.loads((out / "manifest.json").read_text())
    assert "perf_record" not in manifest["collectors"] or (
        manifest["collectors"]["perf_record"]["status"] == "skipped"
    )
    assert not (out / "perf.json").exists()
    ebpf = manifest["collectors"]["ebpf"]
    assert "native.json" in ebpf["files"]
    notes = ebpf["notes"]
    assert notes["native_samples"] > 0 and notes["native_stacks_lost"] == 0, notes
    assert any("native stacks" in a for a in notes["attached"]), notes["attached"]
    bundle = load_bundle(out)
    assert bundle.perf is not None and bundle.perf.source == "eBPF"
    assert (bundle.perf.period_ns == round(1e9 / notes["native_rate_hz"])).all()
    assert (np.diff(bundle.perf.t_ns) >= 0).all(), "samples in time order"
    # The main thread and at least four of the seven workers, by their own tids.
    assert recipe.pid in set(bundle.perf.tid.tolist())
    assert len(set(bundle.perf.tid.tolist()) - {recipe.pid}) >= 4


def test_workers_in_the_copy_kernel_and_the_kernels_frames(
    default_capture: Captured,
) -> None:
    out, recipe = default_capture
    bundle = load_bundle(out)
    samples = copy_kernel_samples(bundle, recipe.pid)
    assert len({tid for _, tid in samples}) >= 4, samples[:5]
    # Copying into fresh shared memory faults every page in: the kernel's half of the stack is
    # there, named from kallsyms, below the user frames (root first: user, then kernel).
    perf = bundle.perf
    assert perf is not None
    kernel = [
        stack
        for stack in perf.stacks
        if stack
        and perf.frames[stack[-1]][1] == KERNEL_DSO
        and perf.frames[stack[0]][1] != KERNEL_DSO
    ]
    assert kernel, "no sample holds kernel frames under user frames"
    names = {perf.frames[f][0] for stack in kernel for f in stack}
    assert any("fault" in name for name in names), sorted(names)[:20]


def test_copy_kernel_samples_fall_inside_regions(default_capture: Captured) -> None:
    """Both on the one clock: the workers' samples in the copy kernel lie inside the regions the
    probes saw (those of the window's times the probes were on)."""
    out, recipe = default_capture
    bundle = load_bundle(out)
    times = probed(bundle, [t for t, _ in copy_kernel_samples(bundle, recipe.pid)])
    assert len(times) >= 20
    assert inside_regions(bundle, times) >= 0.9 * len(times), len(times)


def test_the_report_names_the_op_and_the_workers_activity(
    default_capture: Captured,
) -> None:
    out, _ = default_capture
    reported = run_profkit("report", str(out), "--format", "json")
    assert reported.returncode == 0, reported.stderr
    report = json.loads(reported.stdout)
    (pool,) = [p for p in report["pools"] if p["runtime"] == "openmp"]
    assert pool["top_work"][0]["symbol"] == "direct_copy_kernel", pool["top_work"]
    assert sum(pool["activity"].values()) == pytest.approx(1.0, abs=0.01)
    (row,) = [r for r in report["attribution"] if r["pool"] == "openmp"]
    assert row["op"] == "aten::copy_" and row["site"].endswith("shm_fanout.py:24"), row


def test_dwarf_call_graphs_bring_perf_record_back(
    tmp_path: Path, start_recipe: StartRecipe
) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "2")
    out = tmp_path / "b"
    result = attach(recipe.pid, out, "--perf-callgraph", "dwarf", duration=1.0)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["collectors"]["perf_record"]["status"] in ("ok", "partial")
    assert (out / "perf.json").exists() and not (out / "native.json").exists()
    assert "native_samples" not in manifest["collectors"]["ebpf"]["notes"]
