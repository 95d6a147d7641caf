"""Dispatch sites in `watch`'s metrics on a real recipe: the pool's CPU split by region time per
Python line."""

from __future__ import annotations

import re
import time

import pytest

from ..support import RECIPES
from ..watch_support import agent
from .conftest import StartRecipe

SITES = {"site_one": 1, "site_two": 2, "site_three": 3}
SITE_CPU = re.compile(r"^profkit_site_cpu_seconds_total\{(?P<labels>[^}]*)\} (?P<value>\S+)", re.M)
REGIONS_COUNTED = re.compile(r"^profkit_pool_regions_total\{[^}]*\} [1-9]", re.M)


def counter(metrics: str, name: str) -> float:
    found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)", metrics, re.M)
    assert found, (name, metrics)
    return float(found.group(1))


def line_of(needle: str) -> int:
    lines = (RECIPES / "sites.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def site_cpu(metrics: str) -> dict[str, float]:
    out = {}
    for match in SITE_CPU.finditer(metrics):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        out[labels["site"]] = float(match.group("value"))
    return out


@pytest.mark.root
@pytest.mark.parametrize("loader", ["core", "bcc"])
def test_sites_in_the_recipes_ratio(start_recipe: StartRecipe, loader: str) -> None:
    recipe = start_recipe("sites.py", "--pool", "torch", "--threads", "4", warmup=1.0)
    flags = ("--name", "sites", "--interval", "1", "--ebpf-loader", loader)
    with agent("--pid", str(recipe.pid), *flags) as a:
        a.wait_serving()
        # Counted from the probe's first regions on: the windows before it was ready give
        # their pool CPU to the unknown site, for as long as the load took.
        before = site_cpu(a.wait_for(lambda m: REGIONS_COUNTED.search(m) is not None))
        deadline = time.monotonic() + 60
        grown: dict[str, float] = {}
        metrics = ""
        while time.monotonic() < deadline:
            time.sleep(1)
            metrics = a.metrics()
            grown = {s: v - before.get(s, 0.0) for s, v in site_cpu(metrics).items()}
            if sum(v > 0 for s, v in grown.items() if s != "unknown") == 3 and (
                sum(grown.values()) > 2.0
            ):
                break
        code, _ = a.terminate()
    assert code == 0, a.output
    # Every region the probe counted carries its Python stack (the two counters are read a
    # moment apart, so a window's last few regions may be in one and not yet the other).
    regions = counter(metrics, "profkit_pool_regions_total")
    with_stack = counter(metrics, "profkit_pool_regions_with_stack_total")
    assert regions > 100 and with_stack >= 0.99 * regions, metrics
    assert "profkit_walker_regions_without_stack_total{" in metrics, metrics
    cpu = {site: v for site, v in site_cpu(metrics).items() if site != "unknown"}
    assert len(cpu) == 3, cpu
    total = sum(cpu.values())
    assert grown.get("unknown", 0.0) < 0.5 * sum(grown.values()), (grown, metrics)
    for site, weight in SITES.items():
        label = f"sites.py:{line_of('# ' + site.replace('_', ' '))}"
        named = [s for s in cpu if s.endswith(label)]
        assert named, (label, cpu)
        # The same copy at each site: the pool's CPU splits as the regions do, 1:2:3.
        assert cpu[named[0]] / total == pytest.approx(weight / 6, abs=0.05), cpu
