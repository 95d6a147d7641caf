"""What to do with the region probes once their rate is counted: keep them on, switch them on
for part of the window (duty.py), or take them off. A pure function of the counts and the
budget, returning a frozen decision that the collector carries out and ebpf.json records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .duty import MIN_DUTY

# A first count this close to the probes' part is repeated (for duty.py's RECOUNT_S) before it
# keeps them on: it ran while the other tools started, and counting short there left the probes
# on all the time in some captures of a front that the others switched
# (docs/results/ebpf-cost.md#the-rate-checks-first-count).
RECOUNT_ABOVE = 0.5

RegionAction = Literal["keep", "switch", "detach"]


@dataclass(frozen=True)
class RegionCount:
    """Regions a second over a count, and what their probes would cost the dispatching threads
    (a fraction of their time)."""

    per_s: float
    cost: float


@dataclass(frozen=True)
class RegionDecision:
    action: RegionAction
    per_s: float  # the rate judged by: the higher of the two counts where there were two
    cost: float  # of the dispatching threads' time, with the probes on all the time
    cost_per_region_s: float
    budget: float  # the probes' part of --budget
    duty: float = 1.0  # for "switch": the part of the window the probes are on
    recounted_per_s: float | None = None
    reason: str = ""

    def as_record(self) -> dict[str, object]:
        """ebpf.json's regions_decision (docs/bundle.md)."""
        record: dict[str, object] = {
            "traced": self.action != "detach",
            "regions_per_s": round(self.per_s),
            "cost_per_region_us": round(self.cost_per_region_s * 1e6, 1),
            "expected_cost": self.cost,
        }
        if self.recounted_per_s is not None:
            record["regions_per_s_recounted"] = round(self.recounted_per_s)
        if self.action == "switch":
            record["duty"] = round(self.duty, 3)
        if self.reason:
            record["reason"] = self.reason
        return record


@dataclass(frozen=True)
class RegionOutcome:
    """What became of the region probes over a capture: its decision (None where the rate
    check failed before deciding), and what the window then did; ebpf.json's regions_decision.
    The collector replaces it (dataclasses.replace) as the window goes on."""

    decision: RegionDecision | None = None
    reason: str = ""  # why the probes went off or were switched, where they did
    recounted_per_s: float | None = None  # counted again as the switching started
    duty: float | None = None  # the last one, from the window's rate
    on_ns: tuple[tuple[int, int], ...] | None = None  # the switched probes' on-times
    probed_s: float | None = None
    regions_before_on_times: int | None = None  # the rate check's, left out
    regions_after_on_times: int | None = None  # entered as the entry probes went off

    def as_record(self) -> dict[str, object]:
        record = self.decision.as_record() if self.decision else {}
        if self.recounted_per_s is not None:
            record["regions_per_s_recounted"] = round(self.recounted_per_s)
        if self.reason:
            record["reason"] = self.reason
        if self.duty is not None:
            record["duty"] = round(self.duty, 3)
        if self.on_ns is not None:
            record["on_ns"] = [list(interval) for interval in self.on_ns]
        if self.probed_s is not None:
            record["probed_s"] = round(self.probed_s, 3)
        if self.regions_before_on_times is not None:
            record["regions_before_on_times"] = self.regions_before_on_times
        if self.regions_after_on_times is not None:
            record["regions_after_on_times"] = self.regions_after_on_times
        return record


def needs_recount(first: RegionCount, budget: float, walker: bool, pyspy: bool) -> bool:
    """A first count near the probes' part is counted again before they stay on."""
    return walker and not pyspy and RECOUNT_ABOVE * budget < first.cost <= budget


def decide_regions(
    first: RegionCount,
    again: RegionCount | None,
    budget: float,
    fallback_cost_s: float,
    *,
    walker: bool,
    pyspy: bool,
    sampling: bool,
) -> RegionDecision:
    """first: the rate check's count; again: its repeat where needs_recount said so;
    fallback_cost_s: a region's cost where no region was counted; walker: the Python stack
    walker runs (its stacks are what a switched window keeps); pyspy: py-spy is in the set;
    sampling: the walker's sampler runs (the workers' samples place the pool without probes)."""
    counted = again if again is not None and again.cost > first.cost else first
    per_region_s = counted.cost / counted.per_s if counted.per_s else fallback_cost_s
    recounted = again.per_s if again is not None else None
    if counted.cost <= budget:
        return RegionDecision(
            "keep", counted.per_s, counted.cost, per_region_s, budget, 1.0, recounted
        )
    cost = (
        f"the target started {counted.per_s:,.0f} regions a second, ~{100 * counted.cost:.1f}% "
        f"of its dispatching thread at {1e6 * per_region_s:.1f} us per region, over their "
        f"{100 * budget:.2g}% part of the budget"
    )
    duty = budget / counted.cost
    if walker and not pyspy and duty >= MIN_DUTY:
        # The walker's stacks are what place the pool here: a sample of the regions in time
        # keeps them, at the budget's cost (duty.py).
        reason = (
            f"OpenMP region probes switched on {100 * duty:.0f}% of the time: {cost}; the "
            "pool's call sites come from the regions of those times"
        )
        return RegionDecision(
            "switch", counted.per_s, counted.cost, per_region_s, budget, duty, recounted, reason
        )
    reason = f"OpenMP region probes detached: {cost}; " + (
        "the pool's call sites come from its workers' samples, no region is counted"
        if sampling
        else "attribution falls back to py-spy's native stacks"
        if pyspy
        else "attribution has no call site for the pool (py-spy's native stacks would give one)"
    )
    return RegionDecision(
        "detach", counted.per_s, counted.cost, per_region_s, budget, duty, recounted, reason
    )
