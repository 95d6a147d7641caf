"""`profkit quota` on real processes in real child cgroups with real quotas."""

from __future__ import annotations

import json
import os
import time

import pytest

from profkit.host import cgroup
from profkit.host.sandbox import PERIOD_US

from ..support import run_profkit
from .conftest import StartRecipe

pytestmark = pytest.mark.root


def test_effective_quota_and_counters_match_cpu_stat(start_recipe: StartRecipe) -> None:
    recipe = start_recipe("shm_fanout.py", "--copy", "torch", "--threads", "4", cores=0.5)
    cg = cgroup.cpu_cgroup(recipe.pid)
    assert cg.effective_cores == pytest.approx(0.5)
    assert recipe.group is not None
    limited = recipe.group.limited
    # The test's own reads of the group's counters come just inside profkit's window (its
    # sleep), so the two windows differ only by what happened at their edges.
    inner: list[tuple[float, cgroup.CpuStat]] = []

    def read() -> None:
        stat = cgroup.parse_cpu_stat((limited / "cpu.stat").read_text(), cg.version)
        inner.append((time.monotonic(), stat))

    def sleep(seconds: float) -> None:
        read()
        time.sleep(seconds)
        read()

    window = cgroup.measure(cg, 3.0, sleep=sleep)
    (t0, before), (t1, after) = inner
    periods = after.nr_periods - before.nr_periods
    throttled = after.nr_throttled - before.nr_throttled
    throttled_s = (after.throttled_ns - before.throttled_ns) / 1e9
    # Each edge, the time between profkit's read and the test's, holds at most one period
    # boundary more than whole periods fit in it; each throttled period ending there adds at
    # most a period on every CPU to the throttled time.
    period_s = PERIOD_US / 1e6
    edges = 2 + int(max(0.0, window.seconds - (t1 - t0)) / period_s)
    assert 0 <= window.periods - periods <= edges, (window.periods, periods, edges)
    assert 0 <= window.throttled_periods - throttled <= edges, (window, throttled, edges)
    extra_s = window.throttled_seconds - throttled_s
    assert 0 <= extra_s <= edges * period_s * (os.cpu_count() or 1), (window, throttled_s)
    assert periods >= 25, "a group busy throughout counts (nearly) every period of 3 s"
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
