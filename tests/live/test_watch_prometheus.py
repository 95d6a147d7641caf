"""`profkit watch` scraped by a real Prometheus: its series against the kernel's own counters."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from profkit.autothreads import THREAD_VARIABLES
from profkit.host.cgroup import parse_cpu_stat, recommended_threads

from ..support import RECIPES, stale_uprobe_events
from ..watch_support import (
    Readings,
    agent,
    interpolate,
    need_prometheus,
    prometheus,
    promql,
    samples,
    thread_cpu,
)
from .conftest import StartRecipe, _start

pytestmark = pytest.mark.root

QUOTA = 0.5
SCRAPE_S = 2
# The samples compared span at least this long, all taken after the readings of the truth began.
SPAN_S = 10


def copy_line() -> int:
    lines = (RECIPES / "shm_fanout.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "destination.copy_(" in line)


def cpu_stat(directory: Path) -> tuple[int, int]:
    text = (directory / "cpu.stat").read_text()
    version = "v2" if (directory / "cpu.max").exists() else "v1"
    stat = parse_cpu_stat(text, version)
    return stat.nr_periods, stat.nr_throttled


def pool_cpu(pid: int) -> float:
    # Ground truth without profkit's classification: every thread but the main one, which in
    # this recipe is the pool (and idle helpers).
    return sum(cpu for tid, cpu in thread_cpu(pid).items() if tid != pid)


def wait_span(base: str, selector: str, since: float, timeout: float = 90) -> float:
    """Waits until the series has samples spanning SPAN_S, all taken after `since`; returns the
    time to query them at. The range is whole seconds after `since`, so scrape jitter cannot
    shorten the span below what the test compares."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = time.time()
        seconds = int(at - since)
        if seconds > SPAN_S and promql(base, selector):
            series = samples(base, selector, seconds, at)
            if len(series) >= 4 and series[-1][0] - series[0][0] >= SPAN_S:
                return at
        time.sleep(1)
    raise AssertionError(f"{selector}: no {SPAN_S} s of samples after the readings began")


def test_watch_scraped_by_prometheus(start_recipe: StartRecipe) -> None:
    need_prometheus()
    tag = f"watch-test-{os.getpid()}"
    # The recipe with the default pool, in a quota it cannot run.
    over = start_recipe("shm_fanout.py", "--report-every", "60", cores=QUOTA, warmup=1.0)
    # The same recipe with the environment `run --cap-threads` gives it: pools sized to the
    # quota.
    cap = recommended_threads(QUOTA, len(os.sched_getaffinity(0)))
    capped_env = {variable: str(cap) for variable in THREAD_VARIABLES}
    capped = start_recipe("shm_fanout.py", cores=QUOTA, env=capped_env, warmup=1.0)
    assert over.group is not None and capped.group is not None
    over_group = over.group  # narrowed, for the lambda below
    match = r"shm_fanout\.py --report-every 60"
    with (
        agent("--match", match, "--name", tag, "--interval", "1") as a,
        agent(
            "--cgroup",
            "/" + capped.group.limited.name,
            "--name",
            f"{tag}-capped",
            "--interval",
            "1",
        ) as b,
    ):
        a.wait_serving()
        b.wait_serving()
        with prometheus([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], SCRAPE_S) as base:
            sel = f'profkit_pool_cpu_seconds_total{{target="{tag}"}}'
            with (
                Readings(lambda: pool_cpu(over.pid)) as pool_truth,
                Readings(lambda: cpu_stat(over_group.limited)) as cg_truth,
            ):
                while not (pool_truth.values and cg_truth.values):
                    time.sleep(0.05)
                since = time.time()
                at = wait_span(base, sel, since)
                # Readings continue a moment past `at`, so the last sample lies inside them.
                time.sleep(0.5)
            range_s = int(at - since)
            pool_series = samples(base, sel, range_s, at)
            (t0, v0), (t1, v1) = pool_series[0], pool_series[-1]
            assert len(pool_series) >= 4 and t1 - t0 >= SPAN_S, pool_series
            truth = interpolate(pool_truth.series(float), t1) - interpolate(
                pool_truth.series(float), t0
            )
            measured = v1 - v0
            assert truth > 0.5, f"the recipe's pool burned only {truth:.2f} s"
            assert abs(measured - truth) <= 0.05 * truth, (measured, truth)

            periods = samples(
                base, f'profkit_cgroup_cpu_periods_total{{target="{tag}"}}', range_s, at
            )
            throttled = samples(
                base, f'profkit_cgroup_cpu_throttled_periods_total{{target="{tag}"}}', range_s, at
            )
            (p0t, p0), (p1t, p1) = periods[0], periods[-1]
            (_, q0), (_, q1) = throttled[0], throttled[-1]
            true_periods = interpolate(cg_truth.series(lambda v: v[0]), p1t) - interpolate(
                cg_truth.series(lambda v: v[0]), p0t
            )
            true_throttled = interpolate(cg_truth.series(lambda v: v[1]), p1t) - interpolate(
                cg_truth.series(lambda v: v[1]), p0t
            )
            ratio, true_ratio = (q1 - q0) / (p1 - p0), true_throttled / true_periods
            assert abs(ratio - true_ratio) <= 0.02 * true_ratio, (ratio, true_ratio)
            assert abs((p1 - p0) - true_periods) <= 0.02 * true_periods

            print(
                f"pool CPU: profkit {measured:.3f} s, /proc {truth:.3f} s over {t1 - t0:.1f} s; "
                f"throttled ratio: profkit {ratio:.4f}, cpu.stat {true_ratio:.4f} "
                f"({p1 - p0:.0f} vs {true_periods:.1f} periods)"
            )
            findings = {
                r["metric"]["target"]: float(r["value"][1])
                for r in promql(base, 'profkit_finding{id="quota-oversubscription"}')
            }
            assert findings == {tag: 1.0, f"{tag}-capped": 0.0}, findings

            top = promql(base, f'topk(1, profkit_site_cpu_seconds_total{{target="{tag}"}})')
            assert top[0]["metric"]["site"].endswith(f"shm_fanout.py:{copy_line()}"), top
            assert top[0]["metric"]["op"] == "aten::copy_"

            # The capped recipe has given what is asked of it (its finding); what follows is
            # the other recipe's restart, and its CPU would only be taken from the other lanes.
            capped.stop()
            # Restart: the same command, a new pid, in the same cgroup.
            before = float(promql(base, sel)[0]["value"][1])
            old_pid = over.pid
            over.stop()
            restarted = _start(
                [str(RECIPES / "shm_fanout.py"), "--report-every", "60"], over.group, None
            )
            try:
                assert restarted.pid != old_pid
                time.sleep(SCRAPE_S * 4 + 2)
                result = promql(base, sel)
                assert len(result) == 1, result  # one series, no pid in its labels
                after = float(result[0]["value"][1])
                assert after > before + 1.0, (before, after)
                resets = promql(base, f"resets({sel}[2m])")
                assert float(resets[0]["value"][1]) == 0
                assert (
                    float(
                        promql(base, f'profkit_targets{{instance="127.0.0.1:{a.port}"}}')[0][
                            "value"
                        ][1]
                    )
                    == 1
                )
                regions = promql(base, f'rate(profkit_pool_regions_total{{target="{tag}"}}[15s])')
                assert float(regions[0]["value"][1]) > 10, regions
            finally:
                restarted.stop()
        code_a, took_a = a.terminate()
        code_b, took_b = b.terminate()
    assert (code_a, code_b) == (0, 0), a.output + b.output
    assert took_a < 5 and took_b < 5
    assert "every probe detached" in a.output
    assert stale_uprobe_events() == []
