"""The overhead budget's arithmetic, on synthetic /proc rows and an injected clock."""

from __future__ import annotations

import pytest

from profkit.capture.budget import (
    FIXED_PART,
    HANG_S,
    NONBLOCKING,
    PYSPY_CPU_PART,
    PYSPY_CPU_S_PER_THREAD,
    PYSPY_STOP_PART,
    REGION_PROBE_PART,
    SCHED_TRACE_PART,
    Budget,
    BudgetMonitor,
    StopEstimate,
    auto_mode,
    default_rate,
    native_budget,
    native_sample_cost_s,
    pyspy_stop_part,
    wilson_lower,
)

S = 1_000_000_000
RUNNING, TRACED = ord("R"), ord("t")


def rows(at_s: float, threads: int, stopped: int) -> list[tuple[int, ...]]:
    t = int(at_s * S)
    return [
        (t, tid, 0, 0, -1, TRACED if tid < stopped else RUNNING, -1, -1, 0)
        for tid in range(threads)
    ]


def test_default_rate_fits_the_stop_budget() -> None:
    for cpus in (1, 2, 16, 128):
        rates = [default_rate(threads, 0.02, cpus=cpus) for threads in (1, 9, 17, 33, 65, 129)]
        assert rates == sorted(rates, reverse=True), "never faster for more threads"
    # The measured cases: 2 cores keep a higher rate for a small pool; 16 busy cores do not.
    assert default_rate(9, 0.02, cpus=2) == 2
    assert default_rate(18, 0.02, cpus=2) == 1, "the serving front"
    assert default_rate(65, 0.02, cpus=2) == 1
    assert default_rate(17, 0.02, cpus=16) == 1
    assert default_rate(9, 0.02, cpus=16) < default_rate(9, 0.02, cpus=2), "more threads run"
    assert default_rate(33, 0.10, cpus=2) > default_rate(33, 0.02, cpus=2)
    for threads, cpus in ((9, 2), (17, 16), (65, 2)):
        for stop_part in (pyspy_stop_part(probes=True), pyspy_stop_part(probes=False)):
            rate = default_rate(threads, 0.02, cpus=cpus, stop_part=stop_part)
            assert rate * native_sample_cost_s(threads, cpus) <= stop_part * 0.02 or rate == 1


def test_the_parts_of_the_budget_add_up_to_it() -> None:
    parts = PYSPY_STOP_PART + PYSPY_CPU_PART + REGION_PROBE_PART + SCHED_TRACE_PART
    assert parts + FIXED_PART == pytest.approx(1.0)
    # Without the probes, py-spy's stops may take their parts, and no more.
    assert pyspy_stop_part(probes=True) == PYSPY_STOP_PART
    assert pyspy_stop_part(probes=False) + PYSPY_CPU_PART + FIXED_PART == pytest.approx(1.0)
    assert default_rate(9, 0.02, cpus=2, stop_part=pyspy_stop_part(probes=False)) == 4
    # Without py-spy its parts are not spent, nor the scheduler's where it is not traced: the
    # walker's default set aims at 0.3 (scheduler off) to 0.5 (traced) of the budget, under
    # the 1% bound at the default 2%.
    untraced = REGION_PROBE_PART + FIXED_PART
    assert [untraced, untraced + SCHED_TRACE_PART] == pytest.approx([0.3, 0.5])
    # A serving front at 64 threads (scheduler not traced, 550-900 regions a second at 5 times
    # the loop's 3.4 us) gets its probes on about a third to a fifth of the time.
    part = REGION_PROBE_PART * 0.02
    assert [round(part / (rate * 5 * 3.4e-6), 2) for rate in (550, 900)] == [0.32, 0.2]


def test_default_rate_fits_pyspy_cpu_into_its_share_of_the_machine() -> None:
    # --nonblocking stops nothing, but py-spy reads every thread per sample.
    assert default_rate(65, 0.02, "nonblocking", cpus=16) == 10
    assert default_rate(65, 0.02, "nonblocking", cpus=2) == 3
    for threads, cpus in ((65, 2), (129, 2), (9, 2), (33, 16)):
        for mode in ("native", "nonblocking"):
            rate = default_rate(threads, 0.02, mode, cpus)
            cpu = rate * threads * PYSPY_CPU_S_PER_THREAD[mode]
            assert cpu <= PYSPY_CPU_PART * 0.02 * cpus or rate == 1, (threads, cpus, mode)


def test_auto_mode_keeps_native_only_where_one_hertz_fits() -> None:
    with_probes, without = pyspy_stop_part(probes=True), pyspy_stop_part(probes=False)
    # 17 threads on 16 busy CPUs: ~10 ms a sample, 1% at 1 Hz. That fits where no eBPF probe
    # shares the budget (the 16-core machine has no bcc), not next to them.
    assert auto_mode(17, 0.02, 16, without) == ("native", "")
    mode, why = auto_mode(17, 0.02, 16, with_probes)
    assert mode == "nonblocking" and "0.7% part of the 2% budget" in why
    assert auto_mode(18, 0.02, 2, with_probes)[0] == "native", "the serving front"
    assert auto_mode(65, 0.02, 2, with_probes)[0] == "nonblocking"
    mode, why = auto_mode(128, 0.02, 128, without)
    assert mode == "nonblocking"
    assert "128 threads on 128 CPUs" in why and "2% budget" in why
    assert auto_mode(128, 0.30, 128, with_probes)[0] == "native"


@pytest.mark.parametrize(
    ("threads", "cpus", "rate"), [(5, 2, 10), (17, 16, 6), (65, 16, 3), (129, 128, 1)]
)
def test_the_budget_a_command_asks_for_gives_native_samples(
    threads: int, cpus: float, rate: int
) -> None:
    """The command a capture without eBPF or native frames prints: at its --budget the plan's
    own rule picks --native, at 10 Hz where 10% holds that, else at the rate 10% holds, and
    1 Hz at whatever it costs; half a percent less would not hold that rate."""
    budget = native_budget(threads, cpus)
    assert budget * 200 == round(budget * 200)  # whole half-percents, as typed on a command line
    without = pyspy_stop_part(probes=False)
    assert auto_mode(threads, budget, cpus, without)[0] == "native"
    assert default_rate(threads, budget, "native", cpus, without) == rate
    assert default_rate(threads, budget - 0.005, "native", cpus, without) < rate or rate == 1
    assert budget <= 0.1 or rate == 1


def test_stopped_share_ignores_the_attach_pause_and_needs_enough_rows() -> None:
    budget = Budget(fraction=0.02, window_s=3.0, settle_s=1.5)
    monitor = BudgetMonitor(budget, started_ns=0)
    seen: list[tuple[int, ...]] = []
    # The first 1.5 s (py-spy attaching) are fully stopped and must not count.
    for tick in range(10):
        seen += rows(tick * 0.1, threads=10, stopped=10)
    assert monitor.stop_estimate(seen, int(1.0 * S)) is None
    for tick in range(16, 26):
        seen += rows(tick * 0.1, threads=10, stopped=1)
    stops = monitor.stop_estimate(seen, int(2.6 * S))
    assert stops is not None and stops.stopped == pytest.approx(0.1) and stops.instants == 10
    assert not monitor.settled(int(2.6 * S)) and monitor.settled(int(3.0 * S))


def test_a_change_restarts_the_judgement() -> None:
    monitor = BudgetMonitor(Budget(), started_ns=0)
    seen = [row for tick in range(20, 40) for row in rows(tick * 0.1, 10, 2)]
    stops = monitor.stop_estimate(seen, int(4.0 * S))
    assert stops is not None and stops.stopped == pytest.approx(0.2)
    monitor.record(int(4.0 * S), NONBLOCKING, "pyspy", "over budget")
    later = seen + [row for tick in range(41, 50) for row in rows(tick * 0.1, 10, 0)]
    # Everything until 1.5 s after the change is the new py-spy's attach: not judged.
    assert monitor.stop_estimate(later, int(5.0 * S)) is None
    assert monitor.decisions[0].collector == "pyspy"


def test_wilson_lower_bound() -> None:
    # The textbook case: 5 of 10 gives the 95% interval 0.237-0.763.
    assert wilson_lower(5, 10) == pytest.approx(0.2366, abs=1e-4)
    assert wilson_lower(0, 10) == 0.0 and wilson_lower(0, 0) == 0.0
    assert wilson_lower(10, 100) > wilson_lower(1, 10), "more draws, tighter bound"


def judge(instants: int, stopped_at: set[int], threads: int = 18) -> StopEstimate:
    monitor = BudgetMonitor(Budget(fraction=0.02), started_ns=0)
    seen = [
        row
        for tick in range(instants)
        for row in rows(2.0 + tick * 0.2, threads, threads if tick in stopped_at else 0)
    ]
    stops = monitor.stop_estimate(seen, int((2.0 + instants * 0.2) * S))
    assert stops is not None
    return stops


def test_one_sample_inside_one_stop_is_not_evidence() -> None:
    # 2 Hz --native on 18 threads stops the target ~0.8% of the time; a 5-Hz sampler lands in
    # one of those stops now and then. 1 of 15 reads as 6.7% but proves little.
    stops = judge(15, {7})
    assert stops.stopped == pytest.approx(1 / 15)
    assert stops.lower < 2 * 0.02
    assert judge(15, {3, 11}).lower < 2 * 0.02


def test_a_target_stopped_often_is_over_the_budget_with_confidence() -> None:
    # 50 Hz --native on 8 threads: stopped ~10% of the time, seen in a quarter of the samples.
    assert judge(15, {1, 5, 9, 13}).lower > 2 * 0.02
    assert judge(50, set(range(0, 50, 5))).lower > 2 * 0.02


def test_one_long_pause_is_one_stop_and_a_hang_is_acted_on() -> None:
    # py-spy reading a library's symbols holds the target ~0.3 s once: two or three 5-Hz
    # samples land inside that one pause. It is one draw, not three.
    once = judge(15, {6, 7, 8})
    assert once.stopped == pytest.approx(3 / 15)
    assert once.lower < 2 * 0.02 and once.longest_s < HANG_S
    # The same three samples in three separate stops are evidence of stopping often.
    assert judge(15, {2, 7, 12}).lower > once.lower
    # Held for 1.4 s at once: no longer sampling; acted on whatever the share says.
    hang = judge(50, set(range(20, 28)))
    assert hang.longest_s >= HANG_S and hang.lower < 2 * 0.02
