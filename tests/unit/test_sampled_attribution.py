"""The sampled method on made-up samples whose answer is known: shares by count, the interval,
spin while the dispatcher is elsewhere, and when the method is chosen over the stack method."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from profkit.analysis.activity import SPIN, classify_stack
from profkit.analysis.attribution import (
    MIN_DISPATCHED_SAMPLES,
    Attribution,
    SiteShare,
    attribute,
    by_samples,
)
from profkit.bundle.read import DispatchedSamples, EbpfData, Frame, PerfSamples, PyStack

FILE = "/srv/app.py"
SITE_A, SITE_B, SLEEP = Frame(FILE, "a", 10), Frame(FILE, "b", 20), Frame(FILE, "loop", 30)
STACKS = (
    PyStack((Frame(FILE, "<module>", 1), SITE_A), regions=0, region_ns=0),
    PyStack((Frame(FILE, "<module>", 1), SITE_B), regions=0, region_ns=0),
    PyStack((Frame(FILE, "<module>", 1), SLEEP), regions=0, region_ns=0),
)
WORKERS = {11, 12}
WINDOW = (0, 10_000)


def ns(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def sched_with(
    stacks: list[int],
    tids: list[int] | None = None,
    how: list[int] | None = None,
    regions: tuple[list[int], list[int]] = ([], []),
    region_on: tuple[tuple[int, int], ...] = (),
) -> EbpfData:
    count = len(stacks)
    tids = tids or [11 + i % 2 for i in range(count)]
    starts, region_stacks = regions
    return EbpfData(
        threads={},
        wakeups=(),
        slice_tid=ns([]),
        slice_start=ns([]),
        slice_end=ns([]),
        slice_voluntary=ns([]),
        region_tid=ns([1] * len(starts)),
        region_start=ns(starts),
        region_end=ns([t + 5 for t in starts]),
        region_requested=ns([0] * len(starts)),
        lost=0,
        uprobes_attached=bool(starts),
        region_on=region_on,
        region_stack=ns(region_stacks),
        python_stacks=STACKS,
        walker="on",
        dispatched=DispatchedSamples(
            t_ns=ns([10 * (i + 1) for i in range(count)]),
            tid=ns(tids),
            dispatcher=ns([1 if s >= 0 else 0 for s in stacks]),
            how=ns(how or [1 if s >= 0 else 0 for s in stacks]),
            stack=ns(stacks),
            rate_hz=99,
        ),
    )


def test_shares_follow_the_sample_counts_with_a_binomial_interval() -> None:
    sched = sched_with([0] * 30 + [1] * 90)
    result = by_samples(sched, WORKERS, 2.0, WINDOW, [])
    assert result is not None and result.method == "sampled"
    shares = {s.site: s.share for s in result.sites}
    assert shares == {SITE_A: 0.25, SITE_B: 0.75}
    assert [s.samples for s in result.sites] == [90, 30]
    assert result.sites[0].pool_cores == pytest.approx(1.5)
    assert result.uncertainty == pytest.approx(1.96 * (0.25 * 0.75 / 120) ** 0.5)
    assert result.sites[0].stack == STACKS[1].frames


def test_samples_without_a_dispatcher_are_spread_and_widen_the_interval() -> None:
    sched = sched_with([0] * 50 + [1] * 50 + [-1] * 100)
    result = by_samples(sched, WORKERS, 1.0, WINDOW, [])
    assert result is not None
    assert result.labelled_share == pytest.approx(0.5)
    assert result.uncertainty == pytest.approx(1.96 * (0.25 / 100) ** 0.5 + 0.5)
    assert "100 of 200 worker samples" in result.reason


def test_other_threads_and_samples_outside_the_window_do_not_count() -> None:
    sched = sched_with([0] * 40 + [1] * 40, tids=[11] * 40 + [99] * 40)
    result = by_samples(sched, WORKERS, 1.0, (0, 300), [])
    assert result is not None
    assert {s.site: s.samples for s in result.sites} == {SITE_A: 30}  # t = 10, 20, ..., 300


def test_too_few_samples_give_no_attribution() -> None:
    sched = sched_with([0] * (MIN_DISPATCHED_SAMPLES - 1))
    assert by_samples(sched, WORKERS, 1.0, WINDOW, []) is None


def native_for(sched: EbpfData, spinning: list[bool]) -> PerfSamples:
    """The sampler's native stacks for the same samples: a copy kernel, or libgomp's spin."""
    assert sched.dispatched is not None
    gomp = "/usr/lib/libgomp.so.1"
    return PerfSamples(
        frames=(("main", "/usr/bin/python3"), ("direct_copy_kernel", "libtorch.so"), ("", gomp)),
        stacks=((0, 1), (2,)),
        t_ns=sched.dispatched.t_ns,
        tid=sched.dispatched.tid,
        period_ns=ns([1] * len(spinning)),
        stack=ns([1 if spin else 0 for spin in spinning]),
        callgraph="fp",
        source="eBPF",
    )


def test_spin_while_the_dispatcher_sleeps_is_spread_as_the_work() -> None:
    """Workers spinning while their dispatcher sleeps between requests: the sleep's line never
    has a working sample, so it gets no share; spin at a dispatching line stays there."""
    stacks = [0] * 20 + [1] * 60 + [2] * 40 + [1] * 20
    spinning = [False] * 80 + [True] * 60
    sched = sched_with(stacks)
    result = by_samples(sched, WORKERS, 1.0, WINDOW, [], native=native_for(sched, spinning))
    assert result is not None
    assert {s.site: s.samples for s in result.sites} == {SITE_A: 20, SITE_B: 80}
    assert "40 spinning while the dispatcher was elsewhere" in result.reason
    # Without the native stacks the sleep's line is a site of its own.
    blind = by_samples(sched, WORKERS, 1.0, WINDOW, [])
    assert blind is not None and SLEEP in {s.site for s in blind.sites}


def test_a_stray_working_sample_at_the_sleep_does_not_make_it_a_site() -> None:
    """One sample at the sleep's line counted as work (a lock in the C library, a stack that
    did not unwind) made all the spin there a site of its own. Where the region probes saw
    which lines dispatch, those are the sites."""
    stacks = [0] * 20 + [1] * 60 + [2] * 41 + [1] * 20
    spinning = [False] * 80 + [True] * 40 + [False] + [True] * 20
    sched = sched_with(stacks)
    native = native_for(sched, spinning)
    fooled = by_samples(sched, WORKERS, 1.0, WINDOW, [], native=native)
    assert fooled is not None and SLEEP in {s.site for s in fooled.sites}
    seen = by_stack_regions(SITE_A, SITE_B)
    result = by_samples(sched, WORKERS, 1.0, WINDOW, [], seen, native=native)
    assert result is not None
    assert {s.site: s.samples for s in result.sites} == {SITE_A: 20, SITE_B: 80}
    assert "41 at lines the region probes never saw dispatch" in result.reason
    assert result.labelled_share == pytest.approx(100 / 141)


def by_stack_regions(*sites: Frame) -> Attribution:
    """The stack method's answer from a few regions: the lines the region probes saw."""
    shares = tuple(SiteShare(site, None, "", 1 / len(sites), 0.0, 3, 0, None) for site in sites)
    return Attribution("stack", "", 1.0, 1.0, shares, regions=3 * len(sites))


def test_openblas_idle_loop_is_spin_not_work() -> None:
    """OpenBLAS's workers wait in their own loop (blas_thread_server), not in an OpenMP
    barrier: samples there while the dispatcher sleeps are the pool idling, spread as the
    rest, not a share for the sleep's line."""
    stacks = [0] * 20 + [1] * 60 + [2] * 40 + [1] * 20
    sched = sched_with(stacks)
    assert sched.dispatched is not None
    blas = "/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so"
    native = PerfSamples(
        frames=(("[unknown]", blas), ("dgemm_kernel_SKYLAKEX", blas), ("blas_thread_server", blas)),
        stacks=((0, 1), (2,)),
        t_ns=sched.dispatched.t_ns,
        tid=sched.dispatched.tid,
        period_ns=ns([1] * len(stacks)),
        stack=ns([0] * 80 + [1] * 60),
        callgraph="fp",
        source="eBPF",
    )
    assert classify_stack(native, 1) == (SPIN, "blas_thread_server")
    result = by_samples(sched, WORKERS, 1.0, WINDOW, [], native=native)
    assert result is not None
    assert {s.site: s.samples for s in result.sites} == {SITE_A: 20, SITE_B: 80}


def test_samples_decide_where_the_regions_do_not_cover_the_window_as_well() -> None:
    """Probes on the whole window: the stack method, however few its regions. Switched on part
    of it: the stack method, unless its regions bound no split and the samples do (the region
    counts kept). Probes off, no region: the samples place the CPU."""
    regions = ([100, 200, 300], [0, 1, 1])
    whole = sched_with([0] * 30 + [1] * 30, regions=regions)
    assert attribute(None, whole, {1}, WORKERS, 1.0, WINDOW, []).method == "stack"
    # Three regions bound no split; 60 samples do.
    switched = sched_with([0] * 30 + [1] * 30, regions=regions, region_on=((0, 1000),))
    few = attribute(None, switched, {1}, WORKERS, 1.0, WINDOW, [])
    assert few.method == "sampled" and few.regions == 3 and few.regions_with_stack == 3, few
    assert "region counts from the region probes" in few.reason, few.reason
    # 200 regions in turn bound the split, even beside more samples.
    many = sched_with([0] * 30 + [1] * 30, regions=ALTERNATING, region_on=((0, 1000),))
    tight = attribute(None, many, {1}, WORKERS, 1.0, WINDOW, [])
    assert tight.method == "stack" and tight.uncertainty < 1.0, tight
    off = sched_with([0] * 30 + [1] * 30)
    result = attribute(None, off, {1}, WORKERS, 1.0, WINDOW, [])
    assert result.method == "sampled" and result.regions == 0
    assert {s.site: s.samples for s in result.sites} == {SITE_A: 30, SITE_B: 30}


def test_bursts_widen_the_interval_past_the_binomial() -> None:
    """Samples in bursts (a quota runs the pool a few ms each period, every worker sampled in
    one region): blocks of the window all of one site. The count says 200 samples, but they
    are 20 draws: the interval must say so."""
    stacks = [0 if block % 2 else 1 for block in range(20) for _ in range(10)]
    sched = sched_with(stacks)
    assert sched.dispatched is not None
    spaced = replace(sched.dispatched, t_ns=ns([i * 50 for i in range(200)]))
    result = by_samples(replace(sched, dispatched=spaced), WORKERS, 1.0, WINDOW, [])
    assert result is not None
    binomial = 1.96 * (0.25 / 200) ** 0.5
    # 20 draws: about sqrt(200 / 20) = 3.2 times the binomial half-width of 200.
    assert result.uncertainty > 3 * binomial, (result.uncertainty, binomial)


def test_the_stack_methods_interval_says_how_many_regions_it_stands_on() -> None:
    """Every region counted and carrying its stack: one region is no split at all, and regions
    of two sites in turn, evenly spaced, split tightly."""
    one = attribute(None, sched_with([], regions=([100], [0])), {1}, WORKERS, 1.0, WINDOW, [])
    assert one.method == "stack" and one.uncertainty == 1.0
    assert "too few regions to bound the split" in one.reason
    even = attribute(None, sched_with([], regions=ALTERNATING), {1}, WORKERS, 1.0, WINDOW, [])
    assert even.method == "stack" and even.uncertainty < 0.01, even.uncertainty
    assert {s.site: round(s.share, 3) for s in even.sites} == {SITE_A: 0.5, SITE_B: 0.5}


# Two sites in turn, 200 regions 5 ns long and 10 ns apart; three of site B's regions span a
# throttled gap of 2 000 ns, in which no thread of the pool runs.
ALTERNATING = ([100 + 10 * i for i in range(200)], [i % 2 for i in range(200)])
GAPPED = (7, 61, 123)


def gapped(samples: bool) -> EbpfData:
    sched = sched_with([], regions=ALTERNATING)
    ends = sched.region_end.copy()
    ends[list(GAPPED)] += 2_000
    sched = replace(sched, region_end=ends)
    if not samples:
        return sched
    # The workers sampled on a CPU: twice in each region, never in a gap.
    times = ns([t + d for t in ALTERNATING[0] for d in (1, 3)])
    count = len(times)
    return replace(
        sched,
        dispatched=DispatchedSamples(
            t_ns=times,
            tid=ns([11 + i % 2 for i in range(count)]),
            dispatcher=ns([1] * count),
            how=ns([1] * count),
            stack=ns([-1] * count),
            rate_hz=499,
        ),
    )


def test_regions_weighed_by_their_workers_samples_not_a_throttled_gap() -> None:
    """The scheduler not traced: by length, the three gapped regions give site B 93%, and the
    interval from groups of regions widens; by the workers' samples inside the regions, which a
    throttled pool never takes, the split is the work's, 50/50."""
    by_length = attribute(None, gapped(samples=False), {1}, WORKERS, 1.0, WINDOW, [])
    shares = {s.site: s.share for s in by_length.sites}
    assert shares[SITE_B] > 0.9 and by_length.uncertainty > 0.05, (shares, by_length.uncertainty)
    assert "weighed by length" in by_length.reason
    by_samples_inside = attribute(None, gapped(samples=True), {1}, WORKERS, 1.0, WINDOW, [])
    assert by_samples_inside.method == "stack"
    assert "400 on-CPU samples inside them" in by_samples_inside.reason, by_samples_inside.reason
    assert {s.site: round(s.share, 3) for s in by_samples_inside.sites} == {
        SITE_A: 0.5,
        SITE_B: 0.5,
    }
