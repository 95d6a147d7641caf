"""`profkit quota` on real processes in real child cgroups with real quotas."""

from __future__ import annotations

import json

import pytest

from profkit.host import cgroup

from ..support import run_profkit
from .conftest import StartRecipe

pytestmark = pytest.mark.root


def test_effective_quota_and_counters_match_cpu_stat(start_recipe: StartRecipe) -> None:
    recipe = start_recipe("shm_fanout.py", "--copy", "torch", "--threads", "4", cores=0.5)
    cg = cgroup.cpu_cgroup(recipe.pid)
    assert cg.effective_cores == pytest.approx(0.5)
    assert recipe.group is not None
    limited = recipe.group.limited
    # The test reads the group's own counters around profkit's window.
    outer_before = cgroup.parse_cpu_stat((limited / "cpu.stat").read_text(), cg.version)
    window = cgroup.measure(cg, 3.0)
    outer_after = cgroup.parse_cpu_stat((limited / "cpu.stat").read_text(), cg.version)
    periods = outer_after.nr_periods - outer_before.nr_periods
    throttled = outer_after.nr_throttled - outer_before.nr_throttled
    throttled_s = (outer_after.throttled_ns - outer_before.throttled_ns) / 1e9
    assert window.periods == pytest.approx(periods, rel=0.01)
    assert window.throttled_periods == pytest.approx(throttled, rel=0.01)
    assert window.throttled_seconds == pytest.approx(throttled_s, rel=0.01)
    assert window.throttled_periods > 0, "a 4-thread copy loop in half a core must be throttled"
    assert window.usage_cores == pytest.approx(0.5, abs=0.08)


def test_cli_reports_quota_json(start_recipe: StartRecipe) -> None:
    recipe = start_recipe("shm_fanout.py", "--copy", "torch", "--threads", "4", cores=0.5)
    result = run_profkit("quota", "--pid", str(recipe.pid), "--window", "1.5", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["effective_cores"] == pytest.approx(0.5)
    assert report["source"].startswith("/profkit-")
    assert report["period_us"] == 100000
    assert report["recommended_threads"] == 1
    assert report["throttled_periods_pct"] > 50
    assert report["usage_cores"] == pytest.approx(0.5, abs=0.1)
    for key in ("throttled_seconds", "pool_threads"):
        assert key in report


def test_quota_on_parent_is_found_and_named(start_recipe: StartRecipe) -> None:
    recipe = start_recipe(
        "shm_fanout.py", "--copy", "torch", "--threads", "4", cores=0.5, on_parent=True
    )
    result = run_profkit("quota", "--pid", str(recipe.pid), "--window", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cgroup"].endswith("/child")
    assert report["effective_cores"] == pytest.approx(0.5)
    assert report["source"] == report["cgroup"].removesuffix("/child")
    assert report["throttled_periods"] > 0


def test_oversubscription_is_said_plainly(start_recipe: StartRecipe) -> None:
    recipe = start_recipe(
        "shm_fanout.py", "--threads", "2", cores=0.5, env={"OMP_NUM_THREADS": "8"}
    )
    result = run_profkit("quota", "--pid", str(recipe.pid), "--window", "0")
    assert result.returncode == 0, result.stderr
    assert "OVERSUBSCRIBED" in result.stdout
    assert "OMP_NUM_THREADS=1" in result.stdout
    assert "pool threads        8 (OMP_NUM_THREADS)" in result.stdout
