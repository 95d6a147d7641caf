"""Dispatch sites in `watch`'s metrics: the pool's CPU split by region time per Python line, the
top 10 sites of a target by name and the rest as site="other"."""

from __future__ import annotations

import re
import time

import pytest

from profkit.watch.process import ProcessWindow, SiteKey
from profkit.watch.series import OTHER_SITE, TOP_SITES, TargetSeries

from .conftest import RECIPES, needs_root
from .watch_support import agent

SITES = {"site_one": 1, "site_two": 2, "site_three": 3}
SITE_CPU = re.compile(r"^profkit_site_cpu_seconds_total\{(?P<labels>[^}]*)\} (?P<value>\S+)", re.M)


def line_of(needle: str) -> int:
    lines = (RECIPES / "sites.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def site_cpu(metrics: str) -> dict[str, float]:
    out = {}
    for match in SITE_CPU.finditer(metrics):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        out[labels["site"]] = float(match.group("value"))
    return out


@pytest.mark.live
@pytest.mark.root
@needs_root()
def test_sites_in_the_recipes_ratio(start_recipe) -> None:
    recipe = start_recipe("sites.py", "--pool", "torch", "--threads", "4", warmup=1.0)
    with agent("--pid", str(recipe.pid), "--name", "sites", "--interval", "1") as a:
        a.wait_serving()
        deadline = time.monotonic() + 60
        cpu: dict[str, float] = {}
        while time.monotonic() < deadline:
            time.sleep(1)
            cpu = site_cpu(a.metrics())
            if len(cpu) == 3 and sum(cpu.values()) > 2.0:
                break
        code, _ = a.terminate()
    assert code == 0, a.output
    assert len(cpu) == 3, cpu
    total = sum(cpu.values())
    for site, weight in SITES.items():
        label = f"sites.py:{line_of('# ' + site.replace('_', ' '))}"
        named = [s for s in cpu if s.endswith(label)]
        assert named, (label, cpu)
        # The same copy at each site: the pool's CPU splits as the regions do, 1:2:3.
        assert cpu[named[0]] / total == pytest.approx(weight / 6, abs=0.05), cpu


def window(sites: dict[SiteKey, float]) -> ProcessWindow:
    return ProcessWindow(
        seconds=1.0,
        process_cpu=sum(sites.values()) + 0.5,
        python_cpu=0.5,
        pool_cpu=sum(sites.values()),
        regions=100,
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
    keys = [SiteKey(f"app.py:{n}", f"f{n}", "aten::copy_") for n in range(1, 13)]
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
