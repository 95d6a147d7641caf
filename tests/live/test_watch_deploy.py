"""What deploy/ ships: alert rules valid for Prometheus and firing only where they should, a
scrape configuration Prometheus accepts, a systemd unit systemd accepts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import ROOT
from ..watch_support import need_promtool

RULES = ROOT / "deploy" / "prometheus"
UNIT = ROOT / "deploy" / "systemd" / "profkit-watch.service"


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


def test_scrape_config_is_valid() -> None:
    result = subprocess.run(
        [need_promtool(), "check", "config", "scrape-config.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULES,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is valid prometheus config file syntax" in result.stdout


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze")
    profkit = Path(sys.prefix) / "bin" / "profkit"
    if not profkit.exists():
        pytest.skip("profkit is not installed in this environment's bin/")
    # The unit as shipped, pointing at this environment's profkit instead of /opt/profkit.
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/profkit/.venv/bin/profkit", str(profkit)))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
