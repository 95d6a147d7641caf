"""Whole Python stacks: the eBPF walker reads up to 256 frames, so that real model code, a web
server's handler and deep recursion keep their root, the program's own line and their threads'
names; a stack past the bound is cut under one [truncated] root in every output."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from benchmarks.deep_stacks import pool_stacks, reaches_root
from profkit.bundle.frames import Frame
from profkit.bundle.read import Bundle, load_bundle
from profkit.host.pythreads import python_thread_names
from profkit.render.proto import profile_pb2

from ..support import ROOT, run_profkit
from .conftest import StartRecipe, attach
from .test_pystacks_live import report_of

pytestmark = pytest.mark.root

# The walker's documented bound (docs/collectors.md#the-python-stack-walker).
BOUND = 256


def python_sample_stacks(bundle: Bundle) -> dict[int, list[tuple[Frame, ...]]]:
    """The eBPF walker's samples of the Python threads, by thread, each sample's stack."""
    spans = bundle.pyspy
    assert spans is not None and spans.source == "ebpf"
    opened, closed = bundle.window
    keep = (spans.start_ns >= opened) & (spans.start_ns <= closed)
    by_tid: dict[int, list[tuple[Frame, ...]]] = {}
    for tid, stack in zip(spans.tid[keep].tolist(), spans.stack[keep].tolist(), strict=True):
        frames = tuple(spans.frames[i] for i in spans.stacks[stack])
        by_tid.setdefault(tid, []).append(frames)
    return by_tid


def share_reaching(stacks: Sequence[Sequence[Frame]], script: str) -> float:
    assert stacks, "no stack to judge"
    return float(np.mean([reaches_root(s, script) for s in stacks]))


def assert_nothing_cut(out: Path) -> None:
    python = json.loads((out / "ebpf.json").read_text())["python"]
    assert python["walker"] == "on", python.get("reason")
    assert python["counts"]["truncated"] == 0, python["counts"]
    assert not any(s["truncated"] for s in python["stacks"])


def test_sentence_encoder_keeps_its_root_and_names_the_scripts_line(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """sentence-transformers' MiniLM encoding in a loop, default settings: no stack is cut,
    the pool's stacks go down to the script's <module>, and the report names the script's own
    encode line for the pool's CPU, beneath the library's sites."""
    recipe = start_recipe("encoder.py", "--weights", "packaged", "--threads", "4", warmup=2.0)
    out = tmp_path / "b"
    captured = attach(recipe.pid, out, duration=5.0)
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    assert_nothing_cut(out)
    bundle = load_bundle(out)
    assert share_reaching(pool_stacks(bundle), "recipes/encoder.py") >= 0.99
    line = _line_of(Path("recipes/encoder.py"), "return model.encode(")
    report = report_of(out)
    rows = [r for r in report["attribution"] if r["pool"] == "openmp"]
    placed = sum(r["share"] for r in rows if _user_is(r, "recipes/encoder.py", line))
    assert placed >= 0.99, [(r["site"], r["share"], r["user_frame"]) for r in rows]
    text = " ".join(run_profkit("report", str(out)).stdout.split())
    assert "from your code:" in text, text
    own = text.split("from your code:", 1)[1]
    assert f"recipes/encoder.py:{line}: return model.encode(" in own, own[:300]


def test_encoder_behind_a_web_handler(start_recipe: StartRecipe, tmp_path: Path) -> None:
    """The same model behind FastAPI on uvicorn, an `async def` handler under load from two
    clients: the pool's stacks reach the server script's <module> through uvicorn and asyncio,
    and the report names the handler's encode line."""
    recipe = start_recipe(
        "encoder_server.py",
        "--threads",
        "4",
        "--load",
        "2",
        warmup=3.0,
        cores=1.5,
        favoured=False,  # 1.5 of 2 cores, favoured, would starve the other lanes
    )
    match = re.search(r"encode_line=(\d+)", recipe.output)
    assert match, recipe.output
    out = tmp_path / "b"
    captured = attach(recipe.pid, out, duration=5.0)
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    assert_nothing_cut(out)
    bundle = load_bundle(out)
    assert share_reaching(pool_stacks(bundle), "recipes/encoder_server.py") >= 0.99
    report = report_of(out)
    rows = [r for r in report["attribution"] if r["pool"] == "openmp"]
    handler = int(match[1])
    placed = sum(r["share"] for r in rows if _user_is(r, "recipes/encoder_server.py", handler))
    assert placed >= 0.99, [(r["site"], r["share"], r["user_frame"]) for r in rows]


def test_nested_modules_and_named_threads(start_recipe: StartRecipe, tmp_path: Path) -> None:
    """A model of 16 nested modules (its copy about 50 frames down) and two threads that
    threading names, each recursing 120 frames: the Python threads' samples reach their root,
    the pool's reach the script's call line, and both names are in the report."""
    recipe = start_recipe("deep.py", "--modules", "16", "--recurse", "120", "--named", "2")
    found = re.search(r"call_line=(\d+)", recipe.output)
    assert found, recipe.output
    call_line = int(found[1])
    out = tmp_path / "b"
    captured = attach(recipe.pid, out, duration=4.0)
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    assert_nothing_cut(out)
    bundle = load_bundle(out)
    samples = [s for stacks in python_sample_stacks(bundle).values() for s in stacks if s]
    assert share_reaching(samples, "recipes/deep.py") >= 0.99
    deepest = max(len(s) for s in samples)
    assert deepest >= 120, deepest
    pool = pool_stacks(bundle)
    assert np.mean([any(_is_call(f, call_line) for f in s) for s in pool]) >= 0.99
    report = report_of(out)
    rows = [r for r in report["attribution"] if r["pool"] == "openmp"]
    # The modules are the script's own code: the site is its innermost frame, Leaf.forward.
    leaf = sum(r["share"] for r in rows if r["function"].endswith("Leaf.forward"))
    assert leaf >= 0.99 and all(r["site"].startswith(str(ROOT)) for r in rows), rows
    names = {t["name"] for t in report["cpu"]["threads"]}
    assert {"deep-thread", "cls-thread"} <= names, names
    text = run_profkit("report", str(out)).stdout
    table = text.split("THREADS", 1)[1]
    assert "deep-thread" in table and "cls-thread" in table, table


def test_a_stack_past_the_bound_is_cut_under_truncated(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """A thread 400 frames deep: its samples keep the innermost 256 frames under one
    [truncated] root in the folded stacks, pprof and the flame graph, and the report counts
    them."""
    recipe = start_recipe("deep.py", "--modules", "2", "--recurse", "400", "--named", "1")
    out = tmp_path / "b"
    captured = attach(recipe.pid, out, duration=3.0)
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    python = json.loads((out / "ebpf.json").read_text())["python"]
    assert python["counts"]["truncated"] > 0, python["counts"]
    folded = tmp_path / "python.folded"
    exported = run_profkit(
        "export", str(out), "--format", "folded", "--view", "python", "-o", str(folded)
    )
    assert exported.returncode == 0, exported.stderr
    cut = [line for line in folded.read_text().splitlines() if "[truncated]" in line]
    assert cut, folded.read_text()[:2000]
    for line in cut:
        frames = line.rsplit(" ", 1)[0].split(";")
        assert frames[0] == "[truncated]", line[:200]
        assert len(frames) - 1 == BOUND, len(frames)
        assert frames[1].startswith("spin_at"), frames[1]  # mid-recursion: the root is cut
    pprof = tmp_path / "python.pprof"
    exported = run_profkit(
        "export", str(out), "--format", "pprof", "--view", "python", "-o", str(pprof)
    )
    assert exported.returncode == 0, exported.stderr
    profile = profile_pb2.Profile()
    profile.ParseFromString(_maybe_gunzip(pprof.read_bytes()))
    names = {f.id: profile.string_table[f.name] for f in profile.function}
    functions = {loc.id: names[loc.line[0].function_id] for loc in profile.location if loc.line}
    roots = {functions[s.location_id[-1]] for s in profile.sample if s.location_id}
    assert "[truncated]" in roots, roots
    svg = tmp_path / "python.svg"
    drawn = run_profkit("flame", str(out), "--view", "python", "-o", str(svg))
    assert drawn.returncode == 0, drawn.stderr
    assert "[truncated]" in svg.read_text()
    report = report_of(out)
    cut_record = report["python_stacks_cut"]
    assert cut_record["cut"] > 0 and cut_record["bound_frames"] == BOUND, cut_record
    text = run_profkit("report", str(out)).stdout
    assert f"Python stacks cut at {BOUND} frames" in " ".join(text.split()), text


def _user_is(row: dict, script: str, line: int) -> bool:
    """The report row's own-code line is the script's `line`."""
    user = row.get("user_frame")
    if not user:
        return False
    return bool(user["file"].endswith(script) and user["line"] == line)


def _is_call(frame: Frame, line: int) -> bool:
    return frame.file.endswith("recipes/deep.py") and frame.line == line


def _line_of(path: Path, text: str) -> int:
    root = Path(__file__).resolve().parents[2]
    for number, line in enumerate((root / path).read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def _maybe_gunzip(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def test_thread_names_come_from_threading(start_recipe: StartRecipe) -> None:
    """threading's names, read by py-spy dump --nonblocking, keyed by the OS thread id."""
    recipe = start_recipe("deep.py", "--modules", "2", "--recurse", "5", "--named", "2")
    names, why = python_thread_names(recipe.pid)
    assert {"deep-thread", "cls-thread", "MainThread"} <= set(names.values()), (names, why)
    assert recipe.pid in names and names[recipe.pid] == "MainThread", names
