"""The overhead budget's arithmetic, on synthetic /proc rows and an injected clock."""

from __future__ import annotations

import pytest

from profkit.budget import (
    PYSPY_CPU_S_PER_THREAD,
    PYSPY_CPU_SHARE,
    PYSPY_STOP_SHARE,
    Budget,
    BudgetMonitor,
    auto_mode,
    default_rate,
    native_sample_cost_s,
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
    assert default_rate(9, 0.02, cpus=2) == 4
    assert default_rate(65, 0.02, cpus=2) == 1
    assert default_rate(17, 0.02, cpus=16) == 1
    assert default_rate(9, 0.02, cpus=16) < default_rate(9, 0.02, cpus=2), "more threads run"
    assert default_rate(33, 0.10, cpus=2) > default_rate(33, 0.02, cpus=2)
    for threads, cpus in ((9, 2), (17, 16), (65, 2)):
        rate = default_rate(threads, 0.02, cpus=cpus)
        # py-spy's stops get half of the budget; the rest is for its CPU and the other tools.
        assert rate * native_sample_cost_s(threads, cpus) <= PYSPY_STOP_SHARE * 0.02 or rate == 1


def test_default_rate_fits_pyspy_cpu_into_its_share_of_the_machine() -> None:
    # --nonblocking stops nothing, but py-spy reads every thread per sample.
    assert default_rate(65, 0.02, "nonblocking", cpus=16) == 10
    assert default_rate(65, 0.02, "nonblocking", cpus=2) == 5
    for threads, cpus in ((65, 2), (129, 2), (9, 2), (33, 16)):
        for mode in ("native", "nonblocking"):
            rate = default_rate(threads, 0.02, mode, cpus)
            cpu = rate * threads * PYSPY_CPU_S_PER_THREAD[mode]
            assert cpu <= PYSPY_CPU_SHARE * 0.02 * cpus or rate == 1, (threads, cpus, mode)


def test_auto_mode_keeps_native_only_where_one_hertz_fits() -> None:
    assert auto_mode(17, 0.02, 16) == ("native", "")
    assert auto_mode(65, 0.02, 2)[0] == "native"
    mode, why = auto_mode(128, 0.02, 128)
    assert mode == "nonblocking"
    assert "128 threads on 128 CPUs" in why and "2% budget" in why
    assert auto_mode(128, 0.10, 128)[0] == "native"


def test_stopped_share_ignores_the_attach_pause_and_needs_enough_rows() -> None:
    budget = Budget(stopped_share=0.02, window_s=3.0, settle_s=1.5)
    monitor = BudgetMonitor(budget, started_ns=0)
    seen: list[tuple[int, ...]] = []
    # The first 1.5 s (py-spy attaching) are fully stopped and must not count.
    for tick in range(10):
        seen += rows(tick * 0.1, threads=10, stopped=10)
    assert monitor.stopped_share(seen, int(1.0 * S)) is None
    for tick in range(16, 26):
        seen += rows(tick * 0.1, threads=10, stopped=1)
    share = monitor.stopped_share(seen, int(2.6 * S))
    assert share == pytest.approx(0.1)
    assert not monitor.settled(int(2.6 * S)) and monitor.settled(int(3.0 * S))


def test_a_change_restarts_the_judgement() -> None:
    monitor = BudgetMonitor(Budget(), started_ns=0)
    seen = [row for tick in range(20, 40) for row in rows(tick * 0.1, 10, 2)]
    assert monitor.stopped_share(seen, int(4.0 * S)) == pytest.approx(0.2)
    monitor.record(int(4.0 * S), "reduce-rate", "pyspy", "over budget")
    later = seen + [row for tick in range(41, 50) for row in rows(tick * 0.1, 10, 0)]
    # Everything until 1.5 s after the change is the new py-spy's attach: not judged.
    assert monitor.stopped_share(later, int(5.0 * S)) is None
    assert monitor.decisions[0].collector == "pyspy"
