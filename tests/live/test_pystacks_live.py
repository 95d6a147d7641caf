"""The eBPF Python stack walker on real processes: every region carries the stack that
dispatched it, on every supported CPython, and an interpreter it does not know falls back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from profkit.bundle.read import load_bundle
from profkit.capture.budget import REGION_PROBE_PART
from profkit.capture.ebpf.policy import MIN_DUTY

from ..support import NO_BTF, RECIPES, run_profkit
from .conftest import StartRecipe, attach

pytestmark = pytest.mark.root

PYENV = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))) / "versions"
SITES = {"site_one": 1, "site_two": 2, "site_three": 3}
SYSTEM_LIBGOMP = Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1")  # gcc's dependency, libgomp1


def line_of(needle: str) -> int:
    lines = (RECIPES / "sites.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def interpreter(minor: str) -> str | None:
    found = sorted(PYENV.glob(f"{minor}.*/bin/python{minor}"))
    return str(found[-1]) if found else None


def report_of(out: Path) -> dict:
    reported = run_profkit("report", str(out), "--format", "json")
    assert reported.returncode == 0, reported.stderr
    return json.loads(reported.stdout)


def python_part(out: Path) -> dict:
    return json.loads((out / "ebpf.json").read_text())["python"]


def grafts(folded: str) -> set[tuple[str, ...]]:
    """The Python functions above each "[openmp pool" frame of a folded merged export."""
    chains = set()
    for line in folded.splitlines():
        frames = line.rsplit(" ", 1)[0].split(";")
        pool = next((i for i, f in enumerate(frames) if f.startswith("[openmp pool")), None)
        if pool is not None:
            chains.add(tuple(f.split(" (")[0] for f in frames[1:pool]))
    return chains


def rounds_and_edges(out: Path, shuffled: bool = False) -> tuple[dict[str, int], dict[str, int]]:
    """The regions per site of the recipe's whole rounds (one, two, two, three, three, three
    in time order, or in any order where the recipe shuffles each round), and of the partial
    rounds the window's two edges cut. The window opens and closes anywhere in a round: at a
    few dozen rounds, one cut round is more than 1% of a site's count, so exact ratios are only
    asked of the whole rounds."""
    bundle = load_bundle(out)
    sched = bundle.sched
    assert sched is not None
    stacks = sched.python_stacks
    # The regions the report counts: those that start inside the window.
    opened, closed = bundle.window
    inside = (sched.region_start >= opened) & (sched.region_start <= closed)
    order = np.argsort(sched.region_start[inside], kind="stable")
    sites = []
    for index in sched.stacks_of_regions()[inside][order].tolist():
        names = [f.function for f in stacks[index].frames] if index >= 0 else []
        sites.append(next((n for n in reversed(names) if n in SITES), None))
    pattern = [name for name, weight in SITES.items() for _ in range(weight)]
    size = len(pattern)

    def a_round(regions: list) -> bool:
        return regions == pattern if not shuffled else Counter(regions) == Counter(pattern)

    def part_of_a_round(regions: list) -> bool:
        return Counter(regions) <= Counter(pattern)

    # The head is the end of a round the window opened in, the tail the start of one it closed
    # in; everything between is whole rounds. Shuffled, a round is told by its six regions
    # holding one, two and three of the sites: at the wrong offset, some six of a few dozen
    # rounds would not.
    def whole_from(start: int) -> int:
        end = start
        while end + size <= len(sites) and a_round(sites[end : end + size]):
            end += size
        return end

    start = next((i for i in range(size) if whole_from(i) >= len(sites) - size + 1), None)
    assert start is not None, sites[:12]
    end = whole_from(start)
    head, tail = sites[:start], sites[end:]
    if shuffled:
        assert part_of_a_round(head) and part_of_a_round(tail), (head, tail)
    else:
        assert head == pattern[size - len(head) :], head
        assert tail == pattern[: len(tail)], tail[:12]
    whole = {site: sites[start:end].count(site) for site in SITES}
    edges = {site: (head + tail).count(site) for site in SITES}
    return whole, edges


def assert_whole_rounds(out: Path, counts: Mapping[str, int], shuffled: bool = False) -> None:
    """The report's region counts are the whole rounds', exactly 1:2:3, plus the partial rounds
    at the window's edges."""
    whole, edges = rounds_and_edges(out, shuffled)
    assert whole["site_one"] > 0, (whole, edges)
    assert_ratio(whole, 0.0)
    assert {site: whole[site] + edges[site] for site in SITES} == dict(counts), (whole, edges)


def assert_sites_exact(out: Path) -> dict:
    """The report names the three sites, each by its regions' stacks, at its own line, and
    their regions are the whole rounds' exact 1:2:3; the report, for more checks."""
    report = report_of(out)
    rows = {r["function"]: r for r in report["attribution"] if r["pool"] == "openmp"}
    assert set(rows) == set(SITES), report["attribution"]
    assert {r["method"] for r in rows.values()} == {"stack"}
    assert_whole_rounds(out, {site: rows[site]["regions"] for site in SITES})
    for site in SITES:
        line = line_of("# " + site.replace("_", " "))
        assert rows[site]["site"].endswith(f"recipes/sites.py:{line}"), rows[site]
    return report


def assert_ratio(counts: Mapping[str, float], tolerance: float) -> None:
    """counts per site against 1:2:3, each within `tolerance` (relative)."""
    unit = counts["site_one"]
    for site, weight in SITES.items():
        assert counts[site] == pytest.approx(weight * unit, rel=tolerance), counts


def loaded_by(out: Path) -> str:
    return str(json.loads((out / "ebpf.json").read_text())["loader"]["name"])


# The eBPF tests run on the default loader (CO-RE here); these also run on bcc.
LOADERS = pytest.mark.parametrize("loader", ["core", "bcc"])


@LOADERS
def test_three_sites_at_default_settings(
    start_recipe: StartRecipe, tmp_path: Path, loader: str
) -> None:
    recipe = start_recipe("sites.py", "--pool", "torch", "--threads", "4", warmup=1.0)
    captured = attach(recipe.pid, tmp_path / "b", "--ebpf-loader", loader, duration=5.0)
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    assert loaded_by(tmp_path / "b") == loader
    report = report_of(tmp_path / "b")
    rows = {r["function"]: r for r in report["attribution"] if r["pool"] == "openmp"}
    assert set(rows) == set(SITES), report["attribution"]
    assert {r["method"] for r in rows.values()} == {"stack"}
    # Region counts in the recipe's ratio: only the rounds cut by the window's edges differ.
    assert_whole_rounds(tmp_path / "b", {site: rows[site]["regions"] for site in SITES})
    # The same copy at each site: the pool's CPU splits the same way, within what the capture
    # can tell (where the scheduler was not traced, the workers' samples inside the regions
    # weigh them, and the interval says how many there were).
    for site, weight in SITES.items():
        bound = max(0.05, 1.5 * rows[site]["uncertainty"])
        assert abs(rows[site]["share"] - weight / 6) <= bound, rows
        line = line_of("# " + site.replace("_", " "))
        assert rows[site]["site"].endswith(f"recipes/sites.py:{line}"), rows[site]
    pool = next(p for p in report["pools"] if p["runtime"] == "openmp")
    assert pool["regions_with_stack"] >= 0.99 * pool["regions"] > 0, pool
    notes = [n for n in report["attribution_notes"] if n["pool"] == "openmp"]
    assert "regions carry their Python stack" in notes[0]["reason"], notes
    # The merged flame graph grafts the pool under the real stack of each site.
    exported = run_profkit(
        "export", str(tmp_path / "b"), "--format", "folded", "-o", str(tmp_path / "m.folded")
    )
    assert exported.returncode == 0, exported.stderr
    chains = grafts((tmp_path / "m.folded").read_text())
    nested = ("<module>", "main", "run", "one_round", "helper_outer", "helper_inner", "site_three")
    assert nested in chains, chains


def test_three_sites_with_the_probes_switched(start_recipe: StartRecipe, tmp_path: Path) -> None:
    """A budget too small for the probes switches them: off as the window opens, on for the
    last part of it (a window under 45 s is one period). With the scheduler traced, each
    region's worker time is what ran between it and the next, and the pool's CPU must still
    split 1:2:3. Worker time before the on-time's first region belongs to a region nobody saw
    (it went to the last region seen, one site's); several on-times are the unit tests'."""
    # Paced, the recipe starts 6 regions a round and at most 40 rounds a second; how many it
    # runs is this machine's. A first capture, at a budget that keeps the probes on, measures
    # that rate with the same check in the same set. The second gives the probes' part of its
    # budget a third of what the measured rate costs: its check then finds them over their part
    # unless it counts under a third of that rate, and switches them on for about a third of
    # the window (taking them off would need 17 times the rate: a duty under MIN_DUTY). An
    # on-time of a third of the window holds the window's length times rate / 18 rounds: the
    # window is made long enough for 50 (8-40 s), so that the rounds cut at the on-time's two
    # edges move the sites' ratio by about 2%.
    # The rate must be the pace's, not the machine's, for the first capture's to hold in the
    # second: with 48-MB copies the recipe ran as fast as two cores let it, and a busy machine
    # moved its rate from 76 to 40 regions a second, or from 104 to 149, between the two. Copies
    # of 4 MB keep it at its pace beside two busy cores (about 220 a second, with or without
    # them), ahead of the other lanes' processes (niceness -10); shuffled, the wake-up a round's
    # first region pays falls on each site in proportion.
    recipe = start_recipe(
        "sites.py",
        *("--pool", "torch", "--threads", "4", "--rounds-per-s", "40", "--mb", "4", "--shuffle"),
        warmup=1.0,
        nice=-10,
    )
    rate = tmp_path / "rate"
    measuring = attach(recipe.pid, rate, "--budget", "100", "--ebpf-sched", "on", duration=1.0)
    assert measuring.returncode == 0, measuring.stderr
    measured = json.loads((rate / "ebpf.json").read_text())["regions_decision"]
    assert measured["action"] == "keep", measured
    assert measured["regions_per_s"] > 0 and measured["expected_cost"] > 0, measured
    duty = 1 / 3
    budget = 100 * duty * measured["expected_cost"] / REGION_PROBE_PART
    duration = min(40.0, max(8.0, 50 * 6 / (duty * measured["regions_per_s"])))
    out = tmp_path / "b"
    captured = attach(
        recipe.pid, out, "--budget", f"{budget:.4g}", "--ebpf-sched", "on", duration=duration
    )
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    ebpf = json.loads((out / "ebpf.json").read_text())
    decision = ebpf["regions_decision"]
    assert decision["action"] == "switch", (
        f"not switched at --budget {budget:.4g}: {decision}; {measured}"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    part = REGION_PROBE_PART * manifest["options"]["budget"]["fraction"]
    assert decision["expected_cost"] > part, (decision, part)
    on = decision["on_ns"]
    assert len(on) == 1 and ebpf["slices"]["tid"], decision
    window = manifest["window"]
    assert window["start_ns"] < on[0][0] < on[0][1] >= window["end_ns"], (window, on)
    starts = ebpf["regions"]["start_ns"]
    assert all(any(a <= t <= b for a, b in on) for t in starts), "regions only in on-times"
    # The on-time closes as eBPF's teardown begins, which then reads the region log: the
    # regions left out after it are those the recipe started in that teardown, 6 a round and
    # rounds at least 1/40 s apart.
    teardown_s = manifest["teardown_s"]["ebpf"]
    after = decision["regions_after_on_times"]
    assert after <= 6 * (40 * teardown_s + 2), (after, teardown_s)
    assert decision["regions_before_on_times"] > 0, "the rate check's regions are left out"
    # The duty follows from the rate the recipe is paced at, which the regions of the on-time
    # give (the probes' part over that rate times the cost a region was measured at); a third
    # apart at most, as a paced rate moves little between the rate check and the window.
    rate = len(starts) / ((on[0][1] - on[0][0]) / 1e9)
    expected = part / (rate * decision["cost_per_region_us"] * 1e-6)
    assert decision["duty"] == pytest.approx(min(1.0, max(MIN_DUTY, expected)), rel=0.35), (
        decision,
        rate,
    )
    report = report_of(out)
    rows = {r["function"]: r for r in report["attribution"] if r["pool"] == "openmp"}
    assert set(rows) == set(SITES), report["attribution"]
    # The on-time's whole rounds count 1:2:3 exactly; its two edges cut a round each.
    assert_whole_rounds(out, {site: rows[site]["regions"] for site in SITES}, shuffled=True)
    for site, weight in SITES.items():
        assert rows[site]["share"] == pytest.approx(weight / 6, abs=0.05), rows


def test_nested_frames_give_the_whole_stack(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe("sites.py", "--pool", "gomp", "--rounds-per-s", "50", warmup=0.5)
    captured = attach(recipe.pid, tmp_path / "b", "--collectors", "ebpf,proc", duration=2.0)
    assert captured.returncode == 0, captured.stderr
    # The bare regions use no CPU, so there is no pool to attribute: read the stacks.
    stacks = [s for s in python_part(tmp_path / "b")["stacks"] if s["regions"]]
    row = next(s for s in stacks if s["frames"][-1]["function"] == "site_three")
    functions = [f["function"] for f in row["frames"]]
    assert functions == [
        "<module>",
        "main",
        "run",
        "one_round",
        "helper_outer",
        "helper_inner",
        "site_three",
    ], row["frames"]
    lines = [f["line"] for f in row["frames"][-3:]]
    assert lines == [line_of("# helper outer"), line_of("# helper inner"), line_of("# site three")]


def test_dispatch_from_a_second_thread(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe(
        "sites.py", "--pool", "gomp", "--rounds-per-s", "50", "--thread", warmup=0.5
    )
    captured = attach(recipe.pid, tmp_path / "b", "--collectors", "ebpf,proc", duration=2.0)
    assert captured.returncode == 0, captured.stderr
    ebpf = json.loads((tmp_path / "b" / "ebpf.json").read_text())
    dispatchers = set(ebpf["regions"]["tid"])
    assert dispatchers and recipe.pid not in dispatchers, "regions come from the second thread"
    assert all(index >= 0 for index in ebpf["regions"]["stack"])
    stacks = [s for s in python_part(tmp_path / "b")["stacks"] if s["regions"]]
    outer = {tuple(f["function"] for f in s["frames"][:2]) for s in stacks}
    assert outer == {("Thread._bootstrap", "Thread._bootstrap_inner")}, outer


# Debian's python3.11 links the interpreter into the executable: no libpython to find it in.
STATIC_PYTHON = Path("/usr/bin/python3.11")


@pytest.mark.parametrize("minor", ["3.10", "3.11", "3.12", "3.13", "3.11-static"])
def test_every_supported_python(start_recipe: StartRecipe, tmp_path: Path, minor: str) -> None:
    if minor.endswith("-static"):
        assert STATIC_PYTHON.exists(), "Debian's python3.11 (bcc's own Python) is missing"
        python: str | None = str(STATIC_PYTHON)
        minor = minor.removesuffix("-static")
    else:
        python = interpreter(minor)
    if python is None:
        pytest.skip(f"no CPython {minor} installed")
    recipe = start_recipe(
        "sites.py", "--pool", "gomp", "--rounds-per-s", "80", python=python, warmup=0.5
    )
    captured = attach(recipe.pid, tmp_path / "b", "--collectors", "ebpf,proc", duration=2.0)
    assert captured.returncode == 0, captured.stderr
    part = python_part(tmp_path / "b")
    assert part["walker"] == "on" and part["version"] == minor, part
    assert part["counts"]["read_failures"] == 0 and part["counts"]["truncated"] == 0, part
    by_site: dict[str, int] = {}
    # Stacks with regions: the others are on-CPU samples of the loop between regions.
    for stack in (s for s in part["stacks"] if s["regions"]):
        inner = stack["frames"][-1]
        by_site[inner["function"]] = by_site.get(inner["function"], 0) + stack["regions"]
        assert inner["line"] == line_of(f"# {inner['function'].replace('_', ' ')}"), stack
    assert set(by_site) == set(SITES), by_site
    # ~100 rounds: the rounds cut by the window's edges are a few percent of them.
    assert_ratio(by_site, 0.05)


def test_unknown_interpreter_falls_back_with_the_reason(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    python = interpreter("3.9")
    if python is None:
        pytest.skip("no CPython 3.9 installed to stand for an unknown layout")
    # Regions without their stacks stay only within the probes' part of the budget (policy.py):
    # paced at 60 regions a second, they do so at five times the cost a quiet machine measures,
    # which a busy one can (at 300 a second, a run beside the other lanes recorded none).
    recipe = start_recipe(
        "sites.py", "--pool", "gomp", "--rounds-per-s", "10", python=python, warmup=0.5
    )
    captured = attach(recipe.pid, tmp_path / "b", "--collectors", "ebpf,proc", duration=1.0)
    assert captured.returncode == 0, captured.stderr
    part = python_part(tmp_path / "b")
    assert part["walker"] == "off" and "3.9 is not supported" in part["reason"], part
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert "Python stack walker off" in manifest["collectors"]["ebpf"]["reason"]
    ebpf = json.loads((tmp_path / "b" / "ebpf.json").read_text())
    assert ebpf["regions"]["tid"], ebpf.get("regions_decision")
    assert set(ebpf["regions"]["stack"]) == {-1}


def test_without_ebpf_the_pool_gets_a_site_or_the_command_that_gives_one(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """Neither loader (bcc off, a kernel without BTF for the CO-RE object). Under a budget whose
    part for py-spy's stops cannot hold even one --native sample a second, py-spy goes
    --nonblocking, nothing has native frames or region times, and the report says so in one
    line with the one command that places the pool; that command, run, places it: py-spy's
    native samples name all three sites."""
    recipe = start_recipe("sites.py", "--pool", "torch", "--threads", "4", warmup=1.0)
    env = {"PROFKIT_DISABLE_BCC": "1"}
    first = attach(recipe.pid, tmp_path / "a", "--budget", "0.1", env=env, hide=NO_BTF)
    assert first.returncode == 0, first.stderr
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["collectors"]["ebpf"]["status"] == "unavailable"
    assert manifest["options"]["pyspy_mode"] == "nonblocking", manifest["options"]
    budget = manifest["options"]["pyspy_native_budget"]
    command = f"profkit attach --pid {recipe.pid} --pyspy-mode native --budget {100 * budget:g}"
    assert f"`{command}` would give one" in first.stderr, first.stderr
    note = next(n for n in report_of(tmp_path / "a")["attribution_notes"] if n["pool"] == "openmp")
    assert note["method"] == "none" and "\n" not in note["reason"], note
    assert f"`{command}` would place it" in note["reason"], note

    flags = command.split("--pid", 1)[1].split()[1:]  # the command's own flags, as printed
    second = attach(recipe.pid, tmp_path / "b", *flags, env=env, duration=6.0, hide=NO_BTF)
    recipe.stop()  # what follows reads the bundle only
    assert second.returncode == 0, second.stderr
    report = report_of(tmp_path / "b")
    note = next(n for n in report["attribution_notes"] if n["pool"] == "openmp")
    assert note["method"] == "proportional", note
    rows = {r["function"] for r in report["attribution"] if r["pool"] == "openmp"}
    assert rows == set(SITES), report["attribution"]


def test_every_copy_of_a_runtime_is_probed(start_recipe: StartRecipe, tmp_path: Path) -> None:
    """Two copies of libgomp mapped (as a package bundling its own brings): both probed, and
    each region counted against the copy that ran it."""
    recipe = start_recipe("sites.py", "--pool", "gomp2", "--rounds-per-s", "50", warmup=0.5)
    # The scheduler traced whatever the machine's switch rate: it tells each copy's workers.
    captured = attach(
        recipe.pid, tmp_path / "b", "--collectors", "ebpf,proc", "--ebpf-sched", "on", duration=2.0
    )
    assert captured.returncode == 0, captured.stderr
    ebpf = json.loads((tmp_path / "b" / "ebpf.json").read_text())
    copies = [r for r in ebpf["runtimes"] if r["name"] == "libgomp"]
    assert len(copies) == 2 and len({c["path"] for c in copies}) == 2, ebpf["runtimes"]
    stacks = python_part(tmp_path / "b")["stacks"]
    per_copy: dict[int, set[str]] = {}
    for runtime, stack in zip(ebpf["regions"]["runtime"], ebpf["regions"]["stack"], strict=True):
        per_copy.setdefault(runtime, set()).add(stacks[stack]["frames"][-1]["function"])
    second = next(c["index"] for c in copies if "libgomp-copy" in c["path"])
    first = next(c["index"] for c in copies if c["index"] != second)
    assert per_copy == {first: {"site_one", "site_two"}, second: {"site_three"}}, per_copy
    # The report has a pool per copy, each with its own regions, workers and call sites; one
    # is named by its kind, the other by its kind and file.
    report = report_of(tmp_path / "b")
    pools = {p["library"]: p for p in report["pools"]}
    assert set(pools) == {c["path"] for c in copies}, report["pools"]
    names = sorted(p["runtime"] for p in pools.values())
    assert names[0] == "openmp" and names[1].startswith("openmp@"), names
    for path, pool in pools.items():
        assert pool["regions"] > 0 and pool["regions_with_stack"] >= 0.99 * pool["regions"], pool
        assert pool["region_ms"] and pool["dispatchers"], pool
        assert pool["workers"] == 3, pool  # teams of 4: the dispatcher and three workers each
        if pool["runtime"] != "openmp":
            assert pool["runtime"] == f"openmp@{Path(path).name}", pool
    copy_path = next(c["path"] for c in copies if c["index"] == second)
    sites = {
        p["library"]: {r["function"] for r in report["attribution"] if r["pool"] == p["runtime"]}
        for p in report["pools"]
    }
    assert sites == {
        next(p for p in pools if p != copy_path): {"site_one", "site_two"},
        copy_path: {"site_three"},
    }, report["attribution"]


@LOADERS
def test_openblas_pool_attributed_to_its_line(
    start_recipe: StartRecipe, tmp_path: Path, loader: str
) -> None:
    recipe = start_recipe(
        "sites.py", "--pool", "blas", "--rounds-per-s", "10", env={"OPENBLAS_NUM_THREADS": "2"}
    )
    captured = attach(recipe.pid, tmp_path / "b", "--ebpf-loader", loader, duration=4.0)
    assert captured.returncode == 0, captured.stderr
    assert loaded_by(tmp_path / "b") == loader
    report = report_of(tmp_path / "b")
    pool = next(p for p in report["pools"] if p["runtime"] == "openblas")
    assert pool["regions"] > 0 and pool["regions_with_stack"] >= 0.99 * pool["regions"], pool
    rows = {r["function"]: r for r in report["attribution"] if r["pool"] == "openblas"}
    assert set(rows) == set(SITES), report["attribution"]
    assert {r["method"] for r in rows.values()} == {"stack"}
    assert_ratio({site: rows[site]["regions"] for site in SITES}, 0.1)
    for site in SITES:
        line = line_of("# " + site.replace("_", " "))
        assert rows[site]["site"].endswith(f"recipes/sites.py:{line}"), rows[site]


@LOADERS
def test_offcpu_python_stacks_without_pyspy(
    start_recipe: StartRecipe, tmp_path: Path, loader: str
) -> None:
    """With the scheduler traced, the walker reads each Python thread's stack as it leaves
    the CPU: the main thread, waiting on the dispatching thread, is off CPU at its join."""
    recipe = start_recipe(
        "sites.py", "--pool", "gomp", "--rounds-per-s", "50", "--thread", warmup=0.5
    )
    out = tmp_path / "b"
    flags = ("--collectors", "ebpf,proc", "--ebpf-sched", "on", "--ebpf-loader", loader)
    captured = attach(recipe.pid, out, *flags, duration=2.0)
    assert captured.returncode == 0, captured.stderr
    assert loaded_by(out) == loader
    exported = run_profkit(
        "export", str(out), "--format", "folded", "--view", "offcpu", "-o", str(tmp_path / "o")
    )
    assert exported.returncode == 0, exported.stderr
    waits = 0.0
    join = f"main (sites.py:{line_of('# main waits')})"
    for line in (tmp_path / "o").read_text().splitlines():
        frames, weight = line.rsplit(" ", 1)
        if frames.split(";")[0].endswith(f"({recipe.pid})") and join in frames:
            waits += int(weight) / 1e6  # folded weights are in microseconds
    window = json.loads((out / "manifest.json").read_text())["window"]
    seconds = (window["end_ns"] - window["start_ns"]) / 1e9
    assert waits >= 0.8 * seconds, (waits, seconds)


def test_system_libgomp_regions_end_at_the_team_barrier(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """Debian's libgomp1 has GOMP_parallel_end inlined and a tail call to free() at the end: its
    regions still end at the cheap team-barrier point, every one seen to its end, in the
    sites' 1:2:3 ratio."""
    recipe = start_recipe("sites.py", "--pool", "gomp-system", "--rounds-per-s", "50", warmup=0.5)
    # 300 regions a second at 17 us each are over the probes' part of a 2% budget: switched,
    # the rate check's regions would be entered and left out. Every entry is to be seen ending
    # here, so the budget keeps the probes on.
    args = ("--collectors", "ebpf,proc", "--budget", "10")
    captured = attach(recipe.pid, tmp_path / "b", *args, duration=2.0)
    assert captured.returncode == 0, captured.stderr
    ebpf = json.loads((tmp_path / "b" / "ebpf.json").read_text())
    assert ebpf["regions_decision"]["action"] == "keep", ebpf["regions_decision"]
    (runtime,) = ebpf["runtimes"]
    assert Path(runtime["path"]).resolve() == SYSTEM_LIBGOMP.resolve(), runtime
    assert runtime["end"] == "team barrier", runtime
    assert not any(a.startswith("uretprobe") for a in ebpf["attached"]), ebpf["attached"]
    regions = len(ebpf["regions"]["tid"])
    assert regions > 100 and ebpf["region_entries"] - regions <= 1, (
        ebpf["region_entries"],
        regions,
    )
    stacks = python_part(tmp_path / "b")["stacks"]
    per_site: dict[str, int] = {}
    for index in ebpf["regions"]["stack"]:
        site = stacks[index]["frames"][-1]["function"]
        per_site[site] = per_site.get(site, 0) + 1
    assert set(per_site) == set(SITES), per_site
    rounds = per_site["site_one"]
    # The window cuts at most one round at each end.
    for site, share in SITES.items():
        assert abs(per_site[site] - share * rounds) <= 2 * share, per_site


def test_target_in_its_own_pid_namespace(tmp_path: Path) -> None:
    """A containerised target: its interpreter knows its threads by the ids of its own PID
    namespace (it is pid 1 there), the probes by ours; the walker joins them through NSpid."""
    args = [str(RECIPES / "sites.py"), "--pool", "gomp", "--rounds-per-s", "50", "--thread"]
    recipe = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-u", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=RECIPES.parent,
    )
    try:
        assert recipe.stdout is not None
        header = recipe.stdout.readline()
        assert header.startswith("ready sites pid=1 "), header  # pid 1 in its namespace
        children = Path(f"/proc/{recipe.pid}/task/{recipe.pid}/children").read_text().split()
        (pid,) = map(int, children)
        nspid = next(
            line.split()[1:]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("NSpid:")
        )
        assert nspid == [str(pid), "1"], nspid
        time.sleep(0.5)
        captured = attach(pid, tmp_path / "b", "--collectors", "ebpf,proc", duration=2.0)
        assert captured.returncode == 0, captured.stderr
        part = python_part(tmp_path / "b")
        assert part["walker"] == "on", part
        ebpf = json.loads((tmp_path / "b" / "ebpf.json").read_text())
        stacks = ebpf["regions"]["stack"]
        assert len(stacks) > 100 and all(index >= 0 for index in stacks), len(stacks)
        # The regions come from the second thread, known to the target by its inner id.
        dispatchers = set(ebpf["regions"]["tid"])
        assert len(dispatchers) == 1 and pid not in dispatchers, dispatchers
        by_site: dict[str, int] = {}
        for stack in (s for s in part["stacks"] if s["regions"]):
            inner = stack["frames"][-1]["function"]
            by_site[inner] = by_site.get(inner, 0) + stack["regions"]
        assert set(by_site) == set(SITES), by_site
        assert_ratio(by_site, 0.05)
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            for child in Path(f"/proc/{recipe.pid}/task/{recipe.pid}/children").read_text().split():
                os.kill(int(child), signal.SIGINT)
        try:
            recipe.wait(timeout=20)
        except subprocess.TimeoutExpired:
            recipe.kill()
            recipe.wait()
