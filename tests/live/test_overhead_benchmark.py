"""The overhead benchmark's output on a real (short) run: its structure, never its timings."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import ROOT


@pytest.mark.root
@pytest.mark.timeout(240)
def test_a_short_run_prints_one_row_per_configuration_and_pool(tmp_path: Path) -> None:
    raw = tmp_path / "ratios.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.overhead",
            "--targets",
            "fanout",
            "--threads",
            "2",
            "--rounds",
            "2",
            "--seconds",
            "1",
            "--warmup",
            "0.5",
            "--configs",
            "profkit-proc,pyspy-native-20hz,noop",
            "--json",
            str(raw),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        check=True,
    )
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("fanout ")]
    # The noise floor first, then each configuration once (in the order the shuffled first
    # round ran them).
    assert [row[1] for row in rows] == ["2"] * 4
    assert rows[0][2] == "bare"
    assert sorted(row[2] for row in rows[1:]) == ["noop", "profkit-proc", "pyspy-native-20hz"]
    ratios = json.loads(raw.read_text())
    assert sorted(ratios) == ["fanout:2"]
    for by_config in ratios.values():
        # Every round ran every configuration once, between two bare windows.
        assert len(by_config["profkit-proc"]) == len(by_config["pyspy-native-20hz"]) == 2
        assert len(by_config["noop"]) == 2
        assert len(by_config["bare"]) == 7
        # and its CPU per copy against theirs
        assert len(by_config["profkit-proc:cpu"]) == len(by_config["noop:cpu"]) == 2
        assert all(
            math.isfinite(value) and value > 0 for values in by_config.values() for value in values
        )
