"""`watch` on a target that starts more regions than its probe's budget allows: the probe is
switched on and off, says so, and the sites still come from the on-times' regions."""

from __future__ import annotations

import contextlib
import os
import re
import time

import pytest

from profkit.host import procfs

from ..support import RECIPES
from ..watch_support import agent
from .conftest import StartRecipe
from .test_watch_sites import site_cpu

COPY_LINE = next(
    i
    for i, text in enumerate((RECIPES / "shm_fanout.py").read_text().splitlines(), 1)
    if "fanout: ATen's parallel copy" in text
)
DUTY = re.compile(r'^profkit_region_probe_duty\{.*runtime="openmp".*\} (\S+)', re.M)
REGIONS = re.compile(r'^profkit_pool_regions_total\{.*runtime="openmp".*\} (\S+)', re.M)


def renice(pid: int, niceness: int) -> None:
    """Every thread of the process (niceness is a thread's, and threads inherit it)."""
    for tid in procfs.list_tids(pid):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, tid, niceness)


@pytest.mark.root
@pytest.mark.parametrize("loader", ["core", "bcc"])
def test_a_flood_of_regions_switches_the_probe(start_recipe: StartRecipe, loader: str) -> None:
    # Unpaced 256-KB copies: some 5 000 regions a second on 2 cores, five times what the
    # probe's budget allows at the least a region was measured to cost (3 us on this VM, 2.2 on
    # a GPU host: docs/results/ebpf-cost.md). Ahead of the other lanes' processes: beside two
    # busy cores the pool's barrier waits out their time slices, and the rate fell to 340 a
    # second, inside the budget (at niceness -10, 4 100). Paced at a copy a millisecond (under
    # 1 000 a second), the rate sat near the budget, and the switch came late or not at all.
    # The recipe is raised to -10 only once the probe counts regions (each window's rate
    # check then sees the flood): raised from its start, it left the agent's probe load (a bcc
    # compile) the CPU of a nice-0 process beside two busy threads nine times its weight.
    recipe = start_recipe("shm_fanout.py", "--threads", "2", "--tensor-mb", "0.25", warmup=1.0)
    flags = ("--name", "flood", "--interval", "1", "--ebpf-loader", loader)
    with agent("--pid", str(recipe.pid), *flags) as a:
        a.wait_serving()
        a.wait_for(lambda m: any(float(v) > 0 for v in REGIONS.findall(m)))
        renice(recipe.pid, -10)
        # Counted from the switch on: the windows before the probe was ready give their pool
        # CPU to the unknown site, for as long as the load took.
        before = site_cpu(a.wait_for(lambda m: (duty_of(m) or 1.0) < 1.0))
        deadline = time.monotonic() + 60
        metrics, duty, cpu = "", None, {}
        while time.monotonic() < deadline:
            time.sleep(1)
            metrics = a.metrics()
            duty = duty_of(metrics)
            cpu = {site: v - before.get(site, 0.0) for site, v in site_cpu(metrics).items()}
            known = sum(v for site, v in cpu.items() if site != "unknown")
            if duty is not None and duty < 1 and known > cpu.get("unknown", 0.0):
                break
        # The shutdown is timed beside the target at the agent's own niceness: at -10 each of
        # its two busy threads outweighs the agent nine to one (CFS weights 9548 and 1024), and
        # a fresh-clone run's shutdown took 5.01 s.
        renice(recipe.pid, 0)
        code, took = a.terminate()
    assert code == 0 and took < 5, a.output
    assert "region probes switched on" in a.output, a.output
    assert duty is not None and duty < 1, metrics
    # The on-time begins as the probe is switched, so the windows from then on have sites.
    named = [site for site, v in cpu.items() if site.endswith(f"shm_fanout.py:{COPY_LINE}") and v]
    assert named, cpu
    assert cpu.get("unknown", 0.0) < 0.5 * sum(cpu.values()), cpu


def duty_of(metrics: str) -> float | None:
    found = DUTY.search(metrics)
    return float(found.group(1)) if found else None
