"""Dispatch sites in `watch`'s metrics: the top 10 sites of a target by name and the rest as
site="other"."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from profkit.bundle.frames import Frame
from profkit.host.cgroup import CgroupCpu, CpuStat
from profkit.watch.metrics import AgentCounters, Snapshot, WatchCollector
from profkit.watch.process import ProcessWindow, SiteKey
from profkit.watch.series import OTHER_SITE, TOP_SITES, TargetSeries


def window(
    sites: dict[SiteKey, float], with_stack: int = 100, failures: dict[str, int] | None = None
) -> ProcessWindow:
    return ProcessWindow(
        seconds=1.0,
        process_cpu=sum(sites.values()) + 0.5,
        python_cpu=0.5,
        pool_cpu=sum(sites.values()),
        regions=100,
        regions_with_stack=with_stack,
        walk_failures=failures or {},
        runtime="openmp",
        team_size=4,
        team_source="workers seen in /proc",
        site_cpu=sites,
        site_stacks={},
        python_threads={"python (1)": 0.5},
        other_threads={},
    )


def test_top_ten_sites_and_other() -> None:
    series = TargetSeries(("t", "", "", ""))
    keys = [SiteKey(Frame("app.py", f"f{n}", n), "aten::copy_") for n in range(1, 13)]
    # Twelve sites, each window: site n burns n/100 s; the two smallest fall into "other".
    for _ in range(3):
        series.add([window({k: (n + 1) / 100 for n, k in enumerate(keys)})], {}, 4, time.time())
    named = {site for (_, site, _) in series.site_cpu}
    assert len(named) == TOP_SITES + 1 and OTHER_SITE in named, named
    assert {"app.py:1", "app.py:2"}.isdisjoint(named)
    assert series.site_cpu[("openmp", OTHER_SITE, "")] == pytest.approx(3 * 0.03)
    assert series.site_cpu[("openmp", "app.py:12", "aten::copy_")] == pytest.approx(3 * 0.12)
    # The top ten follow the CPU: a site that falls out keeps its series, which stops growing,
    # and a site that rises into them gets one.
    shifted = {k: (0.001 if k == keys[-1] else 0.5) for k in keys}
    series.add([window(shifted)], {}, 4, time.time())
    assert series.site_cpu[("openmp", "app.py:12", "aten::copy_")] == pytest.approx(0.36)
    assert series.site_cpu[("openmp", "app.py:2", "aten::copy_")] == pytest.approx(0.5)
    assert ("openmp", "app.py:1", "aten::copy_") not in series.site_cpu
    assert series.site_cpu[("openmp", OTHER_SITE, "")] == pytest.approx(0.09 + 0.5 + 0.001)
    assert sum(series.site_cpu.values()) == pytest.approx(series.pool_cpu["openmp"])


def test_regions_with_their_stack_and_the_walkers_misses() -> None:
    """Counters over windows, as a scrape renders them: regions with a stack beside all
    regions, and the ones without by the walker's reason."""
    series = TargetSeries(("t", "", "", ""))
    key = SiteKey(Frame("app.py", "f", 7), "aten::copy_")
    series.add([window({key: 0.2}, 90, {"no_thread_state": 10, "read_failures": 0})], {}, 4, 1.0)
    series.add([window({key: 0.2}, 97, {"no_thread_state": 1, "read_failures": 2})], {}, 4, 2.0)
    collector = WatchCollector()
    collector.publish(Snapshot((series,), AgentCounters()))
    samples = {
        (m.name, s.labels.get("reason", "")): s.value
        for m in collector.collect()
        for s in m.samples
        if s.labels.get("target") == "t"
    }
    assert samples[("profkit_pool_regions", "")] == 200
    assert samples[("profkit_pool_regions_with_stack", "")] == 187
    assert samples[("profkit_walker_regions_without_stack", "no_thread_state")] == 11
    assert samples[("profkit_walker_regions_without_stack", "read_failures")] == 2


def test_a_window_the_probe_became_ready_in_gives_sites_only_its_rest() -> None:
    """The probe ready 0.9 s into a 1-s window: its regions cover the last 0.1 s, so they place
    a tenth of the window's pool CPU; the rest is the unknown site's, not the few regions' seen
    at the end (before, a bcc compile ending late in a window could hand one site the whole
    window)."""
    from profkit.watch.process import UNKNOWN_SITE, probed_fraction, split_pool_cpu

    late = probed_fraction(ready_s=10.9, window_start_s=10.0, now_s=11.0)
    assert late == pytest.approx(0.1)
    assert probed_fraction(ready_s=5.0, window_start_s=10.0, now_s=11.0) == 1.0
    two = SiteKey(Frame("app.py", "site_two", 2), "aten::copy_")
    split = split_pool_cpu(1.0, {two: 2e6}, late)
    assert split[two] == pytest.approx(0.1)
    assert split[SiteKey(None, row=UNKNOWN_SITE)] == pytest.approx(0.9)
    assert split_pool_cpu(1.0, {two: 2e6}, 1.0) == {two: 1.0}


def test_cgroup_counters_carry_the_time_cpu_stat_was_read() -> None:
    """The process counters are stamped with the window's close, the cgroup counters with
    their own read: on a loaded machine the two are periods apart, and a rate over the
    scraped samples must line up with the kernel's counter at the time it was read."""
    series = TargetSeries(("t", "", "", ""))
    key = SiteKey(Frame("app.py", "f", 7), "aten::copy_")
    group = CgroupCpu("v2", "/t", Path("/sys/fs/cgroup/t"), ())
    for closed, read, periods in ((100.0, 100.3, 10), (101.0, 101.25, 20)):
        stat = CpuStat(periods, periods // 2, 0, 0, None, None)
        series.add([window({key: 0.2})], {group.directory: (group, stat)}, 4, closed, read)
    collector = WatchCollector()
    collector.publish(Snapshot((series,), AgentCounters()))
    stamps = {
        s.name: (s.value, s.timestamp) for m in collector.collect() for s in m.samples if s.labels
    }
    assert stamps["profkit_cgroup_cpu_periods_total"] == (10, 101.25)
    assert stamps["profkit_cgroup_cpu_throttled_periods_total"] == (5, 101.25)
    assert stamps["profkit_process_cpu_seconds_total"][1] == 101.0
