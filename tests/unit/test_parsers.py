"""Parsers over real tool output saved by profkit (py-spy chrometrace, perf script, perf stat)."""

from __future__ import annotations

import json

import pytest

from profkit.capture import demangle
from profkit.capture.collectors.perfrecord import parse_script
from profkit.capture.collectors.perfstat import parse_interval_csv
from profkit.capture.collectors.pyspy import normalise
from profkit.capture.demangle import rename_frames

from ..support import DATA


def test_pyspy_chrometrace_to_spans() -> None:
    events = json.loads((DATA / "fanout_quota/pyspy.chrometrace.json").read_text())
    anchor = 1_000_000_000_000
    spans = normalise(events, anchor)
    pid = json.loads((DATA / "fanout_quota/manifest.json").read_text())["target"]["pid"]
    assert set(spans["spans"]["tid"]) == {pid}
    assert spans["threads"][str(pid)] == "MainThread"
    starts, ends = spans["spans"]["start_ns"], spans["spans"]["end_ns"]
    assert all(s < e for s, e in zip(starts, ends, strict=True))
    assert min(starts) >= anchor
    # Spans follow each other: py-spy merges samples, it never overlaps them on one thread.
    assert all(e <= s2 for e, s2 in zip(ends, starts[1:], strict=False))
    names = {f[0] for f in spans["frames"]}
    assert "copy_with_torch" in names and "main" in names
    # The synthetic thread frame is not a frame of the stack.
    assert not any(n.startswith("thread (") for n in names)
    # Every stack is root first: the module frame comes before the copy.
    for stack in spans["stacks"]:
        frames = [spans["frames"][i][0] for i in stack]
        if "copy_with_torch" in frames:
            assert frames.index("main") < frames.index("copy_with_torch")


def test_perf_script_to_samples() -> None:
    text = (DATA / "fanout_quota/perf_script.txt").read_text()
    headers = [line for line in text.splitlines() if line and not line.startswith("\t")]
    parsed = parse_script(text.splitlines(True))
    samples = parsed["samples"]
    assert len(samples["t_ns"]) == len(headers) > 50
    assert all(p > 0 for p in samples["period_ns"])
    assert samples["t_ns"] == sorted(samples["t_ns"])
    # Leaf frames are last (root first): page-fault samples end in the kernel.
    leaves = {parsed["frames"][stack[-1]][1] for stack in parsed["stacks"] if stack}
    assert "[kernel.kallsyms]" in leaves


def test_perf_script_cut_mid_line() -> None:
    text = (DATA / "fanout_quota/perf_script.txt").read_text()
    cut = text[: len(text) // 2] + text[len(text) // 2 : len(text) // 2 + 7]
    parsed = parse_script(cut.splitlines(True))
    assert len(parsed["samples"]["t_ns"]) == len(parsed["samples"]["stack"])


def test_renamed_frames_that_become_equal_are_merged() -> None:
    parsed = {
        "frames": [["_Z1fi", "lib.so"], ["_Z1fd", "lib.so"], ["main", "app.py"]],
        "stacks": [[2, 0], [2, 1], [2]],
        "samples": {
            "t_ns": [1, 2, 3, 4],
            "tid": [7] * 4,
            "period_ns": [1] * 4,
            "stack": [0, 1, 2, 0],
        },
        "lost": 0,
    }
    # Two overloads of f: their names differ only in the parameters that perf leaves out.
    renamed = rename_frames(parsed, {"_Z1fi": "f", "_Z1fd": "f"})
    assert renamed["frames"] == [["f", "lib.so"], ["main", "app.py"]]
    assert renamed["stacks"] == [[1, 0], [1]]
    assert renamed["samples"]["stack"] == [0, 0, 1, 0]
    assert renamed["samples"]["t_ns"] == [1, 2, 3, 4] and renamed["lost"] == 0


def test_cxxfilt_demangles_as_perf_prints() -> None:
    if not demangle.available():
        pytest.skip("c++filt (binutils) is not installed")
    names = demangle.demangle(
        ["_ZN2at6native4AVX218direct_copy_kernelERNS_18TensorIteratorBaseE", "gomp_barrier", "_Z"]
    )
    assert names["_ZN2at6native4AVX218direct_copy_kernelERNS_18TensorIteratorBaseE"] == (
        "at::native::AVX2::direct_copy_kernel"
    )
    assert "gomp_barrier" not in names


def test_perf_stat_interval_csv() -> None:
    text = (DATA / "fanout_quota/perf_stat.csv").read_text()
    rows = parse_interval_csv(text, anchor_ns=5_000)
    assert {"task-clock", "context-switches", "page-faults"} <= set(rows["event"])
    assert len(set(rows["tid"])) >= 8
    assert min(rows["t_ns"]) > 5_000
    assert all(v >= 0 for v in rows["value"])


def test_perf_stat_not_supported_lines_are_skipped() -> None:
    text = (
        "     0.5,python-42,<not supported>,,cycles,0,100.00,,\n"
        "     0.5,python-42,12.5,msec,task-clock,12,100.00,1.0,CPUs utilized\n"
    )
    rows = parse_interval_csv(text, 0)
    assert rows["event"] == ["task-clock"] and rows["tid"] == [42]
