"""The region probes' duty cycle and the analysis of its on-times, on a clock of the test's own."""

from __future__ import annotations

import random

import numpy as np
import pytest

from profkit.analysis.attribution import _clip, _worker_time_per_region
from profkit.bundle.read import SchedData
from profkit.capture.ebpf.duty import DutyCycle


class Simulated(DutyCycle):
    """A duty cycle whose sleeps and probe changes advance a clock of its own: attaching takes
    `attach_s`, detaching `detach_s` (the kernel's waits), and the run ends after `until_s`."""

    def __init__(self, duty: float, attach_s: float, detach_s: float, until_s: float) -> None:
        self.now_ns = 0
        self.calls: list[tuple[str, bool, int]] = []
        self.limit_ns = int(until_s * 1e9)

        def change(kind: str, seconds: float):  # type: ignore[no-untyped-def]
            def act(entries: bool) -> None:
                self.calls.append((kind, entries, self.now_ns))
                self.now_ns += int(seconds * 1e9)

            return act

        super().__init__(
            duty, lambda: self.now_ns, change("attach", attach_s), change("detach", detach_s)
        )
        self._random = random.Random(7)
        self.window_opened()

    def _wait(self, seconds: float) -> bool:
        self.now_ns += int(seconds * 1e9)
        return self.now_ns >= self.limit_ns


@pytest.mark.parametrize("duty", [0.05, 0.3, 0.8])
def test_the_probes_trap_for_their_duty_of_the_time(duty: float) -> None:
    """Off-times follow the on-times measured, detach waits included: over a long run the
    probes trap (from the first attach to the last detach) for `duty` of the time, the ends
    go on before and come off after the entries, and every on-time lies inside a trapping time."""
    cycle = Simulated(duty, attach_s=0.01, detach_s=0.7, until_s=4000)
    cycle.start(0)
    on = cycle.stop()
    calls = [(kind, entries) for kind, entries, _ in cycle.calls]
    cycles = len(calls) // 4
    assert cycles > 50
    assert calls[:2] == [("detach", True), ("detach", False)]
    assert calls[2:6] == [("attach", False), ("attach", True), ("detach", True), ("detach", False)]
    trapping = [0] + [t for kind, entries, t in cycle.calls if kind == "attach" and not entries]
    released = [t + 0.7e9 for kind, entries, t in cycle.calls if kind == "detach" and not entries]
    trapped_ns = sum(b - a for a, b in zip(trapping, released, strict=False))
    assert trapped_ns / released[-1] == pytest.approx(duty, rel=0.1)
    # The run may end in an on-time, which stop() closes.
    assert len(on) - len(released) in (0, 1) and all(a < b for a, b in on)
    assert all(t <= a and b <= r for (a, b), t, r in zip(on, trapping, released, strict=False))


def test_a_failing_probe_change_stops_the_switching_and_says_why() -> None:
    cycle = Simulated(0.5, attach_s=0.0, detach_s=0.1, until_s=100)

    def refuse(entries: bool) -> None:
        raise OSError("No such process")

    cycle.attach = refuse
    cycle.start(0)
    on = cycle.stop()
    assert cycle.error == "region probes stopped switching: No such process"
    assert len(on) == 1 and on[0][0] == 0


def test_worker_time_is_clipped_to_the_on_times() -> None:
    begin = np.array([0, 50, 200, 390], dtype=np.int64)
    finish = np.array([100, 60, 300, 420], dtype=np.int64)
    starts, ends, opened = _clip(begin, finish, ((40, 80), (250, 400)))
    pieces = sorted(zip(starts.tolist(), ends.tolist(), opened.tolist(), strict=True))
    assert pieces == [(40, 80, 40), (50, 60, 40), (250, 300, 250), (390, 400, 250)]


def test_worker_time_before_an_on_times_first_region_goes_to_no_region() -> None:
    """On-times (0, 100) and (200, 300), one region seen in each, at 10 and 210. Worker time
    at 200-208 ran before the second on-time's first region: a region entered while the probes
    were off owns it, not the one at 10 from the on-time before."""

    def ns(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    sched = SchedData(
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
    assert worker_ns.tolist() == [50.0, 50.0]


def test_the_duty_follows_the_rate_the_on_times_see() -> None:
    """The rate check counted regions while the other tools started; the on-times count them
    again, and the duty settles at budget / (rate x cost) for the rate they see."""
    cycle = Simulated(0.4, attach_s=0.01, detach_s=0.2, until_s=600)
    rate, cost_s, budget = 10_000, 8.5e-6, 0.013  # 8.5% of the thread on: a duty of 0.153
    cycle.entries = lambda: int(rate * cycle.now_ns / 1e9)
    cycle.cost_s, cycle.budget = cost_s, budget
    cycle.start(0)
    cycle.stop()
    assert cycle.duty == pytest.approx(budget / (rate * cost_s), rel=0.01)
