"""The region probes' duty cycle and the analysis of its on-times, on a clock of the test's own."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable

import numpy as np
import pytest

from profkit.analysis.attribution import _clip, _worker_time_per_region
from profkit.bundle.read import EbpfData
from profkit.capture.ebpf.duty import PERIOD_S, DutyCycle
from profkit.capture.ebpf.policy import RegionCount, RegionDecision, Spent


class Simulated(DutyCycle):
    """A duty cycle whose sleeps and probe changes advance a clock of its own: attaching takes
    `attach_s`, detaching `detach_s` (the kernel's waits), and the run ends after `until_s`."""

    def __init__(
        self,
        duty: float,
        attach_s: float,
        detach_s: float,
        until_s: float,
        window_s: float | None = None,
        budget: float = 0.003,
    ) -> None:
        self.now_ns = 0
        self.calls: list[tuple[str, bool, int]] = []
        self.limit_ns = int(until_s * 1e9)

        def change(kind: str, seconds: float) -> Callable[[bool], None]:
            def act(entries: bool) -> None:
                self.calls.append((kind, entries, self.now_ns))
                self.now_ns += int(seconds * 1e9)

            return act

        decision = RegionDecision("switch", RegionCount(1.0, budget / duty), budget, duty)
        super().__init__(
            decision,
            lambda: self.now_ns,
            change("attach", attach_s),
            change("detach", detach_s),
            window_s=window_s,
        )
        self._random = random.Random(7)

    def _wait(self, seconds: float) -> bool:
        self.now_ns += int(seconds * 1e9)
        return self.now_ns >= self.limit_ns

    def regions_at(self, rate: float, trap_s: float, program_s: float) -> None:
        """The target starts `rate` regions a second, each costing `trap_s` in traps and
        `program_s` in the programs' run time (as the kernel's statistics count it)."""

        def measure() -> Spent:
            regions = int(rate * self.now_ns / 1e9)
            return Spent(regions, int(regions * program_s * 1e9), regions * trap_s * 1e9)

        self.measure = measure


@pytest.mark.parametrize("duty", [0.05, 0.3, 0.8])
def test_the_probes_trap_for_their_duty_of_the_time(duty: float) -> None:
    """A capture without an end: the probes come off before the window, and each period of
    PERIOD_S is off and then on, `duty` of the time over a long run; the ends go on before and
    come off after the entries, and one detach falls in each period, not one every few
    seconds (a detach is the costly edge)."""
    cycle = Simulated(duty, attach_s=0.01, detach_s=0.7, until_s=4000)
    cycle.start()
    cycle.window_opened()
    on = cycle.stop()
    calls = [(kind, entries) for kind, entries, _ in cycle.calls]
    assert calls[:2] == [("detach", True), ("detach", False)]
    window_ns = cycle.calls[1][2] + 0.7e9
    assert calls[2:6] == [("attach", False), ("attach", True), ("detach", True), ("detach", False)]
    detaches = calls[2:].count(("detach", True))
    assert 4000 / PERIOD_S / 1.5 < detaches < 4000 / PERIOD_S * 1.5
    probed_ns = sum(b - a for a, b in on)
    assert probed_ns / (cycle.now_ns - window_ns) == pytest.approx(duty, rel=0.15)
    assert all(a < b for a, b in on)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(on))


def test_a_window_of_one_period_detaches_nothing_inside_it() -> None:
    """A 5-s capture at a duty of 0.4: the probes come off before the window, go on 3 s into it
    and stay on to its end; teardown takes them off."""
    cycle = Simulated(0.4, attach_s=0.01, detach_s=0.7, until_s=100, window_s=5.0)
    cycle.start()
    opened_ns = cycle.now_ns
    cycle.window_opened()
    for _ in range(5000):  # the switching thread's two attaches, on the simulated clock
        if len(cycle.calls) >= 4:
            break
        time.sleep(0.001)
    cycle.now_ns = opened_ns + int(5e9)
    on = cycle.stop()
    calls = [(kind, entries, t - opened_ns) for kind, entries, t in cycle.calls]
    assert calls == [
        ("detach", True, -1_400_000_000),
        ("detach", False, -700_000_000),
        ("attach", False, 3_000_000_000),
        ("attach", True, 3_010_000_000),
    ]
    assert on == [(opened_ns + 3_010_000_000, opened_ns + 5_000_000_000)]


def test_a_rate_the_caller_just_counted_is_not_counted_again() -> None:
    """The rate check counts a second time when its first count lies near the probes' part; the
    switching then takes that rate and duty, and detaches at once instead of counting for
    RECOUNT_S more."""
    cycle = Simulated(0.6, attach_s=0.01, detach_s=0.7, until_s=100, window_s=5.0, budget=0.007)
    cycle.regions_at(1000, 15e-6, 2e-6)  # would give another duty
    cycle.start(recounted_per_s=690.0)
    assert cycle.recounted_per_s == 690.0 and cycle.duty == 0.6
    assert [(kind, t) for kind, _, t in cycle.calls] == [("detach", 0), ("detach", 700_000_000)]
    cycle.stop()
    recounting = Simulated(
        0.6, attach_s=0.01, detach_s=0.7, until_s=100, window_s=5.0, budget=0.007
    )
    recounting.regions_at(1000, 15e-6, 2e-6)
    recounting.start()
    assert recounting.recounted_per_s == pytest.approx(1000)
    assert recounting.duty == pytest.approx(0.007 / (1000 * 17e-6))
    assert recounting.last is not None
    assert recounting.last.cost_per_region_s == pytest.approx(17e-6)
    assert recounting.calls[0][2] == 300_000_000
    recounting.stop()


def test_probes_switched_while_on_begin_with_their_on_time() -> None:
    """`watch` switches probes that are already on: nothing comes off at the start; the first
    on-time runs from then for its duty of a period, and the periods after go off, then on."""
    cycle = Simulated(0.1, attach_s=0.01, detach_s=0.7, until_s=200)
    cycle.start_on = True
    cycle.start(recounted_per_s=5000.0)
    cycle.window_opened()
    on = cycle.stop()
    calls = [(kind, entries, t) for kind, entries, t in cycle.calls]
    assert calls[:2] == [
        ("detach", True, int(0.1 * PERIOD_S * 1e9)),
        ("detach", False, 3_750_000_000),
    ]
    assert on[0] == (0, int(0.1 * PERIOD_S * 1e9))
    assert [kind for kind, _, _ in calls[2:4]] == ["attach", "attach"]
    probed_ns = sum(b - a for a, b in on)
    assert probed_ns / cycle.now_ns == pytest.approx(0.1, rel=0.3)


def test_probes_that_fit_their_budget_stay_on_without_a_detach() -> None:
    """A long capture whose on-times see few regions: the duty rises to 1, and the probes stay
    on from the first on-time to the end, with no detach after the one before the window."""
    cycle = Simulated(0.5, attach_s=0.01, detach_s=0.7, until_s=400, budget=0.013)
    cycle.regions_at(10, 7.5e-6, 1e-6)  # 10 regions a second
    cycle.start()
    cycle.window_opened()
    on = cycle.stop()
    assert cycle.duty == 1.0
    calls = [(kind, entries) for kind, entries, _ in cycle.calls]
    assert calls == [("detach", True), ("detach", False), ("attach", False), ("attach", True)]
    assert len(on) == 1


@pytest.mark.parametrize("change", ["attach", "detach"])
def test_a_failing_probe_change_stops_the_switching_and_says_why(change: str) -> None:
    """The target left: the first attach fails (no on-time), or the first detach after an
    on-time does (that on-time is kept)."""
    cycle = Simulated(0.5, attach_s=0.0, detach_s=0.1, until_s=100)

    def refuse(entries: bool) -> None:
        raise OSError("No such process")

    cycle.start()
    setattr(cycle, change, refuse)
    cycle.window_opened()
    on = cycle.stop()
    assert cycle.error == "region probes stopped switching: No such process"
    assert len(on) == (0 if change == "attach" else 1)
    assert all(0 < a < b for a, b in on)


def test_worker_time_is_clipped_to_the_on_times() -> None:
    begin = np.array([0, 50, 200, 390], dtype=np.int64)
    finish = np.array([100, 60, 300, 420], dtype=np.int64)
    starts, ends, opened = _clip(begin, finish, ((40, 80), (250, 400)))
    pieces = sorted(zip(starts.tolist(), ends.tolist(), opened.tolist(), strict=True))
    assert pieces == [(40, 80, 40), (50, 60, 40), (250, 300, 250), (390, 400, 250)]


def test_worker_time_before_an_on_times_first_region_goes_to_no_region() -> None:
    """On-times (0, 100) and (200, 300), one region seen in each, at 10 and 210. Worker time
    at 200-210 ran before the second on-time's first region (the slice at 200-208 and the
    first part of the one at 90-230): a region entered while the probes were off owns it, not
    the one at 10 from the on-time before, nor the one at 210 after it."""

    def ns(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    sched = EbpfData(
        threads={},
        wakeups=(),
        slice_tid=ns([7, 7, 7, 7]),
        slice_start=ns([20, 90, 200, 220]),
        slice_end=ns([60, 230, 208, 240]),
        slice_voluntary=ns([0, 0, 0, 0]),
        region_tid=ns([1, 1]),
        region_start=ns([10, 210]),
        region_end=ns([15, 215]),
        region_requested=ns([0, 0]),
        lost=0,
        uprobes_attached=True,
        region_on=((0, 100), (200, 300)),
    )
    worker_ns = _worker_time_per_region(sched, {7}, ns([10, 210]), (0, 300))
    assert worker_ns.tolist() == [50.0, 40.0]


def test_a_slice_across_regions_is_split_among_them() -> None:
    """A worker that spins between regions stays on its CPU across them: one slice from 0 to
    1000 over regions starting at 100, 110, 400 and 900 gives each the time from its start to
    the next start, and the time before the first to none."""
    starts = np.array([100, 110, 400, 900], dtype=np.int64)
    sched = EbpfData(
        threads={},
        wakeups=(),
        slice_tid=np.array([7, 7], dtype=np.int64),
        slice_start=np.array([0, 950], dtype=np.int64),
        slice_end=np.array([940, 1000], dtype=np.int64),
        slice_voluntary=np.array([0, 0], dtype=np.int64),
        region_tid=np.array([1, 1, 1, 1], dtype=np.int64),
        region_start=starts,
        region_end=starts + 5,
        region_requested=np.zeros(4, dtype=np.int64),
        lost=0,
        uprobes_attached=True,
    )
    worker_ns = _worker_time_per_region(sched, {7}, starts, (0, 1000))
    assert worker_ns.tolist() == [10.0, 290.0, 500.0, 90.0]


def test_the_duty_follows_the_rate_the_on_times_see() -> None:
    """The rate check counted regions while the other tools started; the on-times count them
    again, with what each cost (the traps and the programs' run time the kernel counted), and
    the duty settles at budget / (rate x cost) for what they see."""
    rate, trap_s, program_s, budget = 10_000, 7e-6, 1.5e-6, 0.013  # a duty of 0.153
    cycle = Simulated(0.4, attach_s=0.01, detach_s=0.2, until_s=600, budget=budget)
    cycle.regions_at(rate, trap_s, program_s)
    cost_s = trap_s + program_s
    cycle.start()
    cycle.window_opened()
    cycle.stop()
    assert cycle.duty == pytest.approx(budget / (rate * cost_s), rel=0.01)
