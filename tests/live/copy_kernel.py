"""The workers' samples in ATen's copy kernel, and whether they fall inside the probed regions:
read from perf record's samples or the eBPF sampler's, whichever the bundle holds."""

from __future__ import annotations

import numpy as np

from profkit.bundle.read import Bundle


def copy_kernel_samples(bundle: Bundle, pid: int) -> list[tuple[int, int]]:
    """(time, tid) of every sample of a thread other than pid inside direct_copy_kernel."""
    perf = bundle.perf
    assert perf is not None
    return [
        (int(t), int(tid))
        for t, tid, stack in zip(perf.t_ns, perf.tid, perf.stack, strict=True)
        if int(tid) != pid
        and any("direct_copy_kernel" in perf.frames[f][0] for f in perf.stacks[int(stack)])
    ]


def inside_regions(bundle: Bundle, times: list[int]) -> int:
    """How many of times lie between a region's start and its end."""
    assert bundle.sched is not None
    order = np.argsort(bundle.sched.region_start)
    starts, ends = bundle.sched.region_start[order], bundle.sched.region_end[order]
    index = np.searchsorted(starts, times, side="right") - 1
    return sum(1 for i, t in zip(index, times, strict=True) if i >= 0 and t <= ends[i])


def probed(bundle: Bundle, times: list[int]) -> list[int]:
    """The times inside the window and, where the region probes were switched on and off (a
    rate near their budget, which a busy machine moves across), inside one of their on-times:
    the only times whose regions the log holds."""
    assert bundle.sched is not None
    start, end = bundle.window
    on = bundle.sched.region_on
    return [t for t in times if start <= t <= end and (not on or any(a <= t <= b for a, b in on))]
