"""The overhead benchmark's output: its structure on a real (short) run, never its timings."""

from __future__ import annotations

import math
import statistics

import pytest

from benchmarks import common, overhead, pool


def test_configuration_names_parse_into_what_they_run() -> None:
    assert overhead.parse_config("pyspy-native-100hz") == overhead.Config(
        "pyspy-native-100hz", "pyspy", rate="100"
    )
    default = overhead.parse_config("profkit-default-nonblocking")
    assert (default.kind, default.collectors, default.mode) == ("profkit", "", "nonblocking")
    ebpf = overhead.parse_config("profkit-ebpf-20hz")
    assert (ebpf.collectors, ebpf.rate) == ("ebpf", "20")
    assert overhead.parse_config("noop").kind == "noop"
    tight = overhead.parse_config("profkit-default-budget0.3")
    assert (tight.collectors, tight.rate, tight.budget) == ("", "", "0.3")
    both = overhead.parse_config("profkit-ebpf+proc-5hz-budget1")
    assert (both.collectors, both.rate, both.budget) == ("ebpf,proc", "5", "1")
    with pytest.raises(SystemExit):
        overhead.parse_config("perf-everything")


def test_table_rows_are_ratios_to_the_bare_windows() -> None:
    ratios = {
        "bare": [10.0, 12.0, 11.0],
        "profkit-proc": [0.9, 1.0],
        "profkit-proc:cpu": [1.02, float("nan"), 1.04],
        "noop": [1.0],
    }
    lines = overhead.table({("fanout", 8): ratios})
    assert lines[0].split() == [
        *("target", "threads", "configuration", "ratio", "spread", "median's", "95%", "CPU/unit")
    ]
    assert lines[1].split()[:6] == ["fanout", "8", "bare", "(noise", "floor)", "1.000"]
    assert "0.909-1.091" in lines[1] and "(11.0/s)" in lines[1]
    # The CPU ratios are a column of their configuration's row (windows without marks left out),
    # not a row of their own.
    # The median's bootstrap interval: of two windows, the median of a resample is either one
    # or their mean.
    assert lines[2].split() == [
        *("fanout", "8", "profkit-proc", "0.950", "0.900-1.000", "0.900-1.000", "1.030")
    ]
    assert lines[3].split() == ["fanout", "8", "noop", "1.000", "1.000-1.000", "1.000-1.000"]
    assert len(lines) == 4


def test_cpu_trace_interpolates_between_its_marks_and_not_beyond() -> None:
    trace = overhead.CpuTrace.__new__(overhead.CpuTrace)  # no reader thread: marks by hand
    trace.pid, trace.marks = 0, [(1_000, 1.0), (2_000, 2.0), (4_000, 2.5)]
    assert trace.seconds_between(1_500, 3_000) == pytest.approx(2.25 - 1.5)
    assert trace.seconds_between(1_000, 4_000) == pytest.approx(1.5)
    assert math.isnan(trace.seconds_between(500, 2_000))
    assert math.isnan(trace.seconds_between(2_000, 4_001))


def test_pooled_runs_print_one_row_per_cell_and_configuration() -> None:
    runs = [
        {"serving:8": {"bare": [200.0, 210.0], "profkit-default": [0.97, 0.99], "noop": [1.0]}},
        {"serving:8": {"bare": [190.0], "profkit-default": [1.01]}, "fanout:8": {"noop": [0.98]}},
    ]
    cells = pool.pooled(runs)
    assert cells == {
        "serving:8": {"profkit-default": [0.97, 0.99, 1.01], "noop": [1.0]},
        "fanout:8": {"noop": [0.98]},
    }
    low, high = common.bootstrap_interval(cells["serving:8"]["profkit-default"], statistics.median)
    assert 0.97 <= low <= 0.99 <= high <= 1.01
    lines = pool.table(cells, ["profkit-default"])
    assert lines[0].split() == ["cell", "configuration", "windows", "median", "95%", "interval"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["serving:8", "profkit-default", "3", "0.990"]
    ]
