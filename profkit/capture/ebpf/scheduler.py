"""Whether to trace the scheduler: its tracepoints run on every context switch of the machine,
so the machine's switch rate decides what they would cost the target."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ...host import procfs
from ..budget import SCHED_TRACE_PART, sched_trace_cost
from ..clock import Clock
from ..collectors.base import CaptureContext, EbpfSched


@dataclass(frozen=True)
class SchedDecision:
    """Whether the scheduler is traced, and why; ebpf.json's sched (docs/bundle.md)."""

    traced: bool
    setting: EbpfSched
    reason: str = ""
    switches_per_s: float | None = None  # where the rate decided
    expected_cost: float | None = None  # of the target's throughput, traced all the time

    def as_record(self) -> dict[str, object]:
        record: dict[str, object] = {"traced": self.traced, "setting": self.setting}
        if self.switches_per_s is not None:
            record["switches_per_s"] = round(self.switches_per_s)
            record["expected_cost"] = self.expected_cost
        record["reason"] = self.reason
        return record


def decide_sched(context: CaptureContext, switches: SwitchRate | None = None) -> SchedDecision:
    """Whether to trace the scheduler: its tracepoints run on every context switch of the
    machine, so on a busy one they cost more than their part of the budget
    (docs/collectors.md)."""
    setting = context.options.ebpf_sched
    if setting != "auto":
        on = setting == "on"
        return SchedDecision(
            on, setting, "" if on else "scheduler tracepoints off (--ebpf-sched off)"
        )
    budget = SCHED_TRACE_PART * context.options.budget.fraction
    rate = (switches or SwitchRate(context.clock)).rate()
    cost = sched_trace_cost(rate, os.cpu_count() or 1)
    reason = (
        ""
        if cost <= budget
        else (
            f"scheduler tracepoints skipped: the machine switches {rate:,.0f} times a second on "
            f"{os.cpu_count()} CPUs, which would cost the target ~{100 * cost:.1f}%, over "
            f"their {100 * budget:.2g}% part of the budget (--ebpf-sched on to trace anyway)"
        )
    )
    return SchedDecision(cost <= budget, "auto", reason, rate, cost)


class SwitchRate:
    """Context switches per second on the whole machine, from /proc/stat's ctxt, counted from
    construction: the start-up work in between is measured over rather than slept through."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.before, self.start = procfs.read_context_switches(), clock()

    def rate(self, at_least_s: float = 0.25) -> float:
        remaining = at_least_s - (self.clock() - self.start) / 1e9
        if remaining > 0:
            time.sleep(remaining)
        after, end = procfs.read_context_switches(), self.clock()
        return (after - self.before) / max(1e-9, (end - self.start) / 1e9)


def machine_switch_rate(clock: Clock, seconds: float = 0.25) -> float:
    return SwitchRate(clock).rate(seconds)
