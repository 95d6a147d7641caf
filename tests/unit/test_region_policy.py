"""The region probes' policy on counts whose answer is known: keep, switch or detach, the
recount near the part, and what ebpf.json records of each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profkit.capture.ebpf.duty import MIN_DUTY
from profkit.capture.ebpf.region_policy import (
    RegionCount,
    RegionDecision,
    RegionOutcome,
    decide_regions,
    needs_recount,
)

BUDGET = 0.003  # the probes' part of the default 2% budget with the walker set
COST_S = 17e-6  # what a region costs the serving front, in place


def decide(first: RegionCount, again: RegionCount | None = None, **flags: bool) -> RegionDecision:
    options = {"walker": True, "pyspy": False, "sampling": True, **flags}
    return decide_regions(first, again, BUDGET, COST_S, **options)


def test_a_rate_within_the_part_keeps_the_probes() -> None:
    decision = decide(RegionCount(100, 100 * COST_S))
    assert decision.action == "keep"
    record = decision.as_record()
    assert record["traced"] is True and "duty" not in record and "reason" not in record
    assert record["cost_per_region_us"] == 17.0 and record["regions_per_s"] == 100


def test_over_the_part_the_walker_set_switches_them_for_budget_over_cost() -> None:
    rate = 600
    decision = decide(RegionCount(rate, rate * COST_S))
    assert decision.action == "switch"
    assert decision.duty == pytest.approx(BUDGET / (rate * COST_S))
    assert decision.as_record()["traced"] is True and "switched on" in decision.reason


def test_a_flood_takes_them_off_and_says_where_the_sites_come_from() -> None:
    rate = 51_000  # a sentence encoder's small ops
    decision = decide(RegionCount(rate, rate * COST_S))
    assert BUDGET / (rate * COST_S) < MIN_DUTY
    assert decision.action == "detach" and decision.as_record()["traced"] is False
    assert "workers' samples" in decision.reason
    with_pyspy = decide(RegionCount(rate, rate * COST_S), pyspy=True, sampling=False)
    assert with_pyspy.action == "detach" and "py-spy's native stacks" in with_pyspy.reason


def test_without_the_walker_over_the_part_is_detached_not_switched() -> None:
    decision = decide(RegionCount(600, 600 * COST_S), walker=False, sampling=False)
    assert decision.action == "detach" and "no call site" in decision.reason


def test_a_first_count_near_the_part_is_counted_again_and_the_higher_decides() -> None:
    first = RegionCount(120, 120 * COST_S)  # 68% of the part
    assert needs_recount(first, BUDGET, walker=True, pyspy=False)
    assert not needs_recount(first, BUDGET, walker=True, pyspy=True)
    assert not needs_recount(RegionCount(10, 10 * COST_S), BUDGET, walker=True, pyspy=False)
    higher = RegionCount(300, 300 * COST_S)
    decision = decide(first, higher)
    assert decision.action == "switch" and decision.per_s == 300
    assert decision.as_record()["regions_per_s_recounted"] == 300
    lower = decide(first, RegionCount(50, 50 * COST_S))
    assert lower.action == "keep" and lower.per_s == 120


def test_no_region_counted_costs_what_one_would() -> None:
    decision = decide(RegionCount(0, 0.0))
    assert decision.action == "keep" and decision.cost_per_region_s == COST_S


def test_a_switched_window_records_its_decision_then_its_on_times() -> None:
    rate = 2_000
    decision = decide(RegionCount(rate, rate * COST_S))
    outcome = RegionOutcome(decision, decision.reason, recounted_per_s=1_950.4)
    outcome = replace(
        outcome,
        duty=0.0912345,
        on_ns=((10, 20), (30, 45)),
        probed_s=0.25049,
        regions_before_on_times=3,
        regions_after_on_times=1,
    )
    record = outcome.as_record()
    assert record["traced"] is True and record["reason"] == decision.reason
    assert record["regions_per_s"] == rate and record["regions_per_s_recounted"] == 1_950
    assert record["duty"] == 0.091 and record["probed_s"] == 0.25
    assert record["on_ns"] == [[10, 20], [30, 45]]
    assert (record["regions_before_on_times"], record["regions_after_on_times"]) == (3, 1)


def test_a_failed_rate_check_records_only_why_the_probes_went() -> None:
    why = "OpenMP region probes detached: the rate check failed: boom"
    assert RegionOutcome(reason=why).as_record() == {"reason": why}
