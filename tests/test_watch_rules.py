"""The shipped alert rules: valid for Prometheus, and firing only where they should."""

from __future__ import annotations

import subprocess

from .conftest import ROOT
from .watch_support import need_promtool

RULES = ROOT / "deploy" / "prometheus"


def test_rules_are_valid() -> None:
    result = subprocess.run(
        [need_promtool(), "check", "rules", str(RULES / "profkit-rules.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout


def test_rules_fire_and_hold_back() -> None:
    # The test file has series that must fire (an oversized pool throttled 80%) and series that
    # must not (a capped pool throttled by its own work, 20% throttling, a 10-minute burst).
    result = subprocess.run(
        [need_promtool(), "test", "rules", "profkit-rules.test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULES,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
