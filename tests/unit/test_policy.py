"""The one policy (capture/ebpf/policy.py) on counts whose answer follows from the numbers the
test sets, and attach and watch reaching the same decision for the same counts through their
own code: each drives the policy from a program whose counters the test advances."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import pytest

from profkit.capture.budget import REGION_PROBE_PART, Budget
from profkit.capture.ebpf import collector as collector_module
from profkit.capture.ebpf.collector import EbpfCollector, RegionCosts
from profkit.capture.ebpf.costs import TrapCost
from profkit.capture.ebpf.policy import (
    MIN_DUTY,
    RegionCount,
    SchedCount,
    decide_regions,
    decide_sched,
    needs_recount,
    next_duty,
)
from profkit.watch import probe as watch_probe

BUDGET = 0.003


@pytest.mark.parametrize(
    ("per_s", "cost_us", "action", "duty"),
    [
        (300, 2.4, "keep", 1.0),  # 0.072% of the thread: well within 0.3%
        (300, 10.0, "keep", 1.0),  # exactly the part: kept
        (600, 10.0, "switch", 0.5),  # twice the part: on half the time
        (5_000, 12.0, "switch", 0.05),  # 6%: on a twentieth of it
        (100_000, 3.0, "detach", 0.0),  # 30%: below MIN_DUTY, and the samples place the pool
    ],
)
def test_the_decision_follows_rate_times_cost_against_the_part(
    per_s: float, cost_us: float, action: str, duty: float
) -> None:
    decision = decide_regions(
        RegionCount(per_s, cost_us * 1e-6), BUDGET, stacks=True, placed_by="its workers' samples"
    )
    assert decision.action == action
    assert decision.duty == pytest.approx(duty)
    assert decision.cost_at_duty <= BUDGET + 1e-12
    record = decision.as_record()
    assert record["action"] == action and record["traced"] is (action != "detach")
    assert record["cost_per_region_us"] == pytest.approx(cost_us)
    if action == "detach":
        assert "call sites come from its workers' samples" in decision.reason()


def test_where_nothing_else_places_the_pool_a_flood_keeps_a_sample_of_its_regions() -> None:
    flood = RegionCount(100_000, 3e-6)
    decision = decide_regions(flood, BUDGET, stacks=True, placed_by="")
    assert (decision.action, decision.duty) == ("switch", MIN_DUTY)
    assert "switched on 2% of the time" in decision.reason()
    # Regions without stacks keep nothing a part of them could: they come off.
    bare = decide_regions(RegionCount(600, 10e-6), BUDGET, stacks=False, placed_by="")
    assert bare.action == "detach"


def test_a_first_count_near_the_part_is_counted_again_and_the_higher_decides() -> None:
    first = RegionCount(200, 10e-6)  # 0.2%: two thirds of the part
    assert needs_recount(first, BUDGET)
    assert not needs_recount(RegionCount(100, 10e-6), BUDGET)  # a third of it
    assert not needs_recount(RegionCount(600, 10e-6), BUDGET)  # over it: decided already
    higher = decide_regions(
        first, BUDGET, stacks=True, placed_by="its workers' samples", again=RegionCount(600, 10e-6)
    )
    assert higher.action == "switch" and higher.count.per_s == 600
    assert higher.as_record()["regions_per_s_recounted"] == 600
    lower = decide_regions(
        first, BUDGET, stacks=True, placed_by="its workers' samples", again=RegionCount(50, 10e-6)
    )
    assert lower.action == "keep" and lower.count.per_s == 200


def test_an_on_times_measurement_sets_the_next_duty() -> None:
    decision = decide_regions(
        RegionCount(600, 10e-6), BUDGET, stacks=True, placed_by="its workers' samples"
    )
    assert next_duty(decision, RegionCount(1_200, 10e-6)) == pytest.approx(0.25)
    assert next_duty(decision, RegionCount(100, 10e-6)) == 1.0  # fits: on all the time
    assert next_duty(decision, RegionCount(1e7, 10e-6)) == MIN_DUTY


def test_the_scheduler_is_traced_while_its_measured_cost_fits() -> None:
    # 20 000 switches a second on 2 CPUs at 300 ns each: 0.3% of each CPU.
    count = SchedCount(20_000, 20_000 * 300, 2)
    assert count.cost == pytest.approx(0.003)
    assert decide_sched("auto", count, 0.004).traced
    skipped = decide_sched("auto", count, 0.002)
    assert not skipped.traced and "300 ns a switch (measured)" in skipped.reason()
    assert decide_sched("on", count, 0.002).traced
    assert not decide_sched("off", None, 0.004).traced
    assert not decide_sched("auto", None, 0.004).traced  # no measurement: not on blind


# --- attach and watch, each through its own code, on the same counters ---


@dataclass
class Counters:
    """What a loaded program's counters would say: regions entered by copy 0, and the region
    programs' nanoseconds (the kernel's statistics)."""

    regions: int = 0
    program_ns: int = 0
    attached: list[bool] = field(default_factory=list)
    detached: list[bool] = field(default_factory=list)


class FakeTable:
    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def __getitem__(self, key: ctypes.c_int) -> ctypes.c_uint64:
        return ctypes.c_uint64(self.counters.regions if key.value == 0 else 0)


class FakeProgram:
    """The part of loaders.Program the rate checks use."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def __getitem__(self, name: str) -> FakeTable:
        assert name == "runtime_entries"
        return FakeTable(self.counters)

    def entry_programs(self) -> list[str]:
        return ["on_region_entry"]

    def run_stats(self, programs: list[str]) -> tuple[int, int]:
        return self.counters.regions, self.counters.program_ns

    def attach_regions(self, probes: list[object]) -> None:
        self.counters.attached.append(True)

    def detach_regions(self, entries: bool) -> None:
        self.counters.detached.append(entries)


@dataclass(frozen=True)
class Copy:
    index: int = 0


TRAPS = TrapCost(emulated_s=3e-6, stepped_s=30e-6, how="set by the test")


def counting_collector(counters: Counters) -> EbpfCollector:
    collector = EbpfCollector()
    collector._program = FakeProgram(counters)  # type: ignore[assignment]
    collector._copies = [Copy()]  # type: ignore[list-item]
    collector._costs = RegionCosts(TRAPS, {0: (True, True)})  # 6 us of traps a region
    return collector


def advance(counters: Counters, regions: int, program_ns_each: int) -> None:
    counters.regions += regions
    counters.program_ns += regions * program_ns_each


@pytest.mark.parametrize(
    ("regions_a_second", "action"), [(200, "keep"), (1_000, "switch"), (3_000, "switch")]
)
def test_attach_and_watch_decide_alike_on_the_same_counts(
    monkeypatch: pytest.MonkeyPatch, regions_a_second: int, action: str
) -> None:
    """A region costs 6 us in traps and 2 us in the programs; at 200 a second that is 0.16% of
    the dispatching thread, within the 0.3% part; at 1 000, 0.8%: switched, at a duty of 3/8."""
    budget = REGION_PROBE_PART * Budget().fraction
    decisions = {}

    # attach: the collector's rate check, its sleep advancing the counters by one second.
    counters = Counters()
    collector = counting_collector(counters)
    monkeypatch.setattr(collector_module, "RATE_CHECK_S", 1.0)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        advance(counters, round(regions_a_second * seconds), 2_000)

    monkeypatch.setattr(collector_module.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(collector_module.time, "sleep", sleep)
    monkeypatch.setattr(collector, "calibrate", lambda: TRAPS)
    monkeypatch.setattr(collector_module, "DutyCycle", Recorded)

    @dataclass
    class Context:
        collectors: tuple[str, ...] = ("ebpf", "proc")
        options: object = field(default_factory=lambda: type("O", (), {"budget": Budget()})())
        duration_s: float = 5.0
        clock: object = staticmethod(lambda: 0)

    collector._sampling = True
    collector.walker = type("Walking", (), {"layout": object()})()
    collector._judge_region_rate(Context())  # type: ignore[arg-type]
    assert collector.region_decision is not None
    decisions["attach"] = collector.region_decision

    # watch: its probe's check, the same counters over one second.
    counters = Counters()
    watched = counting_collector(counters)
    probe = watch_probe.RegionProbe.__new__(watch_probe.RegionProbe)
    probe._collector = watched
    probe._cycle = None
    probe._counted = (watched.measured(), 10.0)
    probe.switched = ""
    monkeypatch.setattr(watch_probe.time, "monotonic", lambda: 11.0)
    monkeypatch.setattr(watch_probe, "DutyCycle", Recorded)
    monkeypatch.setattr(watch_probe.RegionProbe, "walker_on", property(lambda self: True))
    advance(counters, regions_a_second, 2_000)
    probe.check_rate()
    assert probe.decision is not None
    decisions["watch"] = probe.decision

    for decision in decisions.values():
        assert decision.budget == pytest.approx(budget)
        assert decision.count.cost_per_region_s == pytest.approx(8e-6)
        assert decision.count.per_s == pytest.approx(regions_a_second)
        assert decision.action == action
    assert decisions["attach"].duty == pytest.approx(decisions["watch"].duty)
    if action == "switch":
        assert decisions["attach"].duty == pytest.approx(budget / (regions_a_second * 8e-6))


class Recorded:
    """A duty cycle that records what it was given and switches nothing."""

    def __init__(self, decision: object, *args: object, **kwargs: object) -> None:
        self.decision = decision
        self.duty = getattr(decision, "duty", 1.0)
        self.error = ""

    def start(self, recounted_per_s: float | None = None) -> None:
        pass

    def window_opened(self) -> None:
        pass

    def stop(self) -> list[tuple[int, int]]:
        return []


def test_a_copy_that_runs_no_region_adds_nothing_to_a_regions_cost() -> None:
    """Two runtime copies probed: torch's libgomp on emulated instructions (6 us of traps a
    region) and another whose points are single-stepped (60 us). Only the first runs regions:
    a region costs its own copy's traps and the programs' run time, not the dearest copy's."""
    counters = Counters()
    collector = counting_collector(counters)
    collector._copies = [Copy(0), Copy(1)]  # type: ignore[list-item]
    collector._costs = RegionCosts(TRAPS, {0: (True, True), 1: (False, False)})
    before = collector.measured()
    advance(counters, 1_000, 2_000)  # copy 0's regions
    count = collector.region_count(before, 1.0)
    assert count.per_s == pytest.approx(1_000)
    assert count.cost_per_region_s == pytest.approx(6e-6 + 2e-6)
