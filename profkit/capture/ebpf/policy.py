"""What to do with probes whose cost is measured: pure functions of counts, measured costs and
the budget, each returning a frozen decision that `attach`, `watch` and `top` carry out alike
and ebpf.json records. Nothing here measures or attaches.

The region probes: a region costs its dispatching thread what costs.py measured (two traps and
the two programs' run time). At the target's region rate that is a part of the dispatching
thread's time. Within the probes' part of the budget they stay on (keep); above it they are on
for `duty` of the time (switch: the regions of the on-times are a sample of the window's, and
their stacks place the pool); where even MIN_DUTY would cost more and something else places the
pool (the sampler's worker samples, or py-spy's native stacks), they come off (detach).

The scheduler's tracepoints run on every context switch and wakeup of the machine: their cost
is the programs' measured run time a second, shared by the machine's CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Below this fraction of the time the on-times are too short and too few to place the pool: the
# probes come off where something else places it, else stay on this fraction of the time.
# (docs/results/ebpf-cost.md#switched-on-and-off-a-flood-of-small-regions)
MIN_DUTY = 0.02
# A first count this close to the probes' part is repeated before it keeps them on: it ran
# while the other tools started, and can count short
# (docs/results/ebpf-cost.md#the-rate-checks-first-count).
RECOUNT_ABOVE = 0.5

RegionAction = Literal["keep", "switch", "detach"]


@dataclass(frozen=True)
class RegionCount:
    """Regions a second over a count, and what one region was measured to cost its dispatching
    thread (the traps and the programs' run time)."""

    per_s: float
    cost_per_region_s: float

    @property
    def cost(self) -> float:
        """The dispatching thread's time the probes take, on all the time (a fraction)."""
        return self.per_s * self.cost_per_region_s


@dataclass(frozen=True)
class Spent:
    """What the region probes have cost so far, cumulative: regions entered, the region
    programs' run time (the kernel's statistics; 0 where it keeps none) and the traps, each copy's
    regions at that copy's calibrated cost (a runtime copy whose probes sit on single-stepped
    instructions costs more a region, and counts only for the regions it ran)."""

    entries: int = 0
    program_ns: int = 0
    trap_ns: float = 0.0


def count_between(before: Spent, after: Spent, seconds: float) -> RegionCount | None:
    """The regions a second between two readings and what one cost; None without a region."""
    regions = after.entries - before.entries
    if regions <= 0 or seconds <= 0:
        return None
    spent_ns = (after.trap_ns - before.trap_ns) + max(0, after.program_ns - before.program_ns)
    return RegionCount(regions / seconds, spent_ns / regions / 1e9)


@dataclass(frozen=True)
class RegionDecision:
    action: RegionAction
    count: RegionCount  # the one judged: the higher of two where there were two
    budget: float  # the probes' part of --budget
    duty: float = 1.0  # the fraction of the time the probes are on (1 unless switched)
    recounted_per_s: float | None = None  # the first count repeated, where it was
    placed_by: str = ""  # what places the pool where the regions do not

    @property
    def cost_at_duty(self) -> float:
        """What the probes take at their duty: the part's at most, but where nothing else places
        the pool (MIN_DUTY then)."""
        return self.count.cost * self.duty

    def reason(self) -> str:
        """Why, in one sentence, where the probes do not simply stay on."""
        if self.action == "keep":
            return ""
        cost = (
            f"the target started {self.count.per_s:,.0f} regions a second, "
            f"~{100 * self.count.cost:.1f}% of its dispatching thread at "
            f"{1e6 * self.count.cost_per_region_s:.1f} us per region (measured), over their "
            f"{100 * self.budget:.2g}% part of the budget"
        )
        if self.action == "switch":
            return (
                f"OpenMP region probes switched on {100 * self.duty:.0f}% of the time: {cost}; "
                "the pool's call sites come from the regions of those times"
            )
        placed = (
            f"the pool's call sites come from {self.placed_by}, no region is counted"
            if self.placed_by
            else "regions without their Python stacks place nothing"
        )
        return f"OpenMP region probes detached: {cost}; {placed}"

    def as_record(self) -> dict[str, object]:
        """ebpf.json's regions_decision (docs/bundle.md)."""
        record: dict[str, object] = {
            "action": self.action,
            "traced": self.action != "detach",
            "regions_per_s": round(self.count.per_s),
            "cost_per_region_us": round(self.count.cost_per_region_s * 1e6, 2),
            # The dispatching thread's time the probes would take on all the time.
            "expected_cost": self.count.cost,
            "budget": self.budget,
            "duty": round(self.duty, 3),
        }
        if self.recounted_per_s is not None:
            record["regions_per_s_recounted"] = round(self.recounted_per_s)
        if self.action != "keep":
            record["reason"] = self.reason()
        return record


def needs_recount(first: RegionCount, budget: float) -> bool:
    """A first count near the probes' part is counted again before they stay on."""
    return RECOUNT_ABOVE * budget < first.cost <= budget


def decide_regions(
    first: RegionCount,
    budget: float,
    *,
    stacks: bool,
    placed_by: str,
    again: RegionCount | None = None,
) -> RegionDecision:
    """first: the rate check's count; again: its repeat where needs_recount said so; stacks:
    the walker reads each region's Python stack (what a sample of regions in time is kept
    for); placed_by: what else places the pool ("its workers' samples", "py-spy's native
    stacks"), "" for nothing: only then may probes too costly for even MIN_DUTY come off."""
    counted = again if again is not None and again.cost > first.cost else first
    recounted = again.per_s if again is not None else None
    if counted.cost <= budget:
        return RegionDecision("keep", counted, budget, 1.0, recounted, placed_by)
    duty = budget / counted.cost
    if not stacks:
        # Regions without their stacks place nothing that some of the window's could: they come
        # off, and py-spy's native stacks place the pool.
        return RegionDecision("detach", counted, budget, 0.0, recounted, placed_by)
    if duty >= MIN_DUTY:
        return RegionDecision("switch", counted, budget, duty, recounted, placed_by)
    if placed_by:
        return RegionDecision("detach", counted, budget, 0.0, recounted, placed_by)
    # Nothing else places the pool: a sample of its regions, at the least duty that can.
    return RegionDecision("switch", counted, budget, MIN_DUTY, recounted, placed_by)


def next_duty(decision: RegionDecision, count: RegionCount) -> float:
    """A switched period's duty, from the rate and cost its on-time measured."""
    if count.cost <= 0:
        return decision.duty
    return min(1.0, max(MIN_DUTY, decision.budget / count.cost))


def as_switched(decision: RegionDecision, count: RegionCount, duty: float) -> RegionDecision:
    """The decision as the switching left it: the duty last set, and the count it was set from
    (what ebpf.json records, its reason included)."""
    return RegionDecision(
        decision.action, count, decision.budget, duty, decision.recounted_per_s, decision.placed_by
    )


@dataclass(frozen=True)
class SchedCount:
    """The scheduler's programs over a trial: switches a second on the machine, and the
    programs' measured run time a second (all of them, on every CPU)."""

    switches_per_s: float
    program_ns_per_s: float
    cpus: int

    @property
    def cost(self) -> float:
        """The machine's CPU time the programs take, a fraction (of each CPU, the target's)."""
        return self.program_ns_per_s / 1e9 / max(1, self.cpus)

    @property
    def ns_per_switch(self) -> float:
        return self.program_ns_per_s / self.switches_per_s if self.switches_per_s else 0.0


@dataclass(frozen=True)
class SchedDecision:
    """Whether the scheduler is traced, and why; ebpf.json's sched (docs/bundle.md)."""

    traced: bool
    setting: str  # --ebpf-sched: auto, on, off
    count: SchedCount | None = None  # the trial's, where one ran
    budget: float | None = None

    def reason(self) -> str:
        if self.setting == "off":
            return "scheduler tracepoints off (--ebpf-sched off)"
        if self.traced or self.count is None or self.budget is None:
            return ""
        count = self.count
        return (
            f"scheduler tracepoints skipped: the machine switched {count.switches_per_s:,.0f} "
            f"times a second on {count.cpus} CPUs, and the programs took "
            f"{count.ns_per_switch:,.0f} ns a switch (measured): ~{100 * count.cost:.2f}% of "
            f"each CPU, over their {100 * self.budget:.2g}% part of the budget "
            "(--ebpf-sched on to trace anyway)"
        )

    def as_record(self) -> dict[str, object]:
        record: dict[str, object] = {"traced": self.traced, "setting": self.setting}
        if self.count is not None:
            record["switches_per_s"] = round(self.count.switches_per_s)
            record["ns_per_switch"] = round(self.count.ns_per_switch, 1)
            record["expected_cost"] = self.count.cost
        if self.budget is not None:
            record["budget"] = self.budget
        record["reason"] = self.reason()
        return record


def decide_sched(setting: str, count: SchedCount | None, budget: float) -> SchedDecision:
    """--ebpf-sched on or off as asked; auto: traced while the trial's measured cost fits the
    scheduler's part of the budget."""
    if setting != "auto":
        return SchedDecision(setting == "on", setting, count)
    if count is None:
        return SchedDecision(False, setting, None, budget)
    return SchedDecision(count.cost <= budget, setting, count, budget)
