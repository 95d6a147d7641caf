"""Inside the pool: what worker CPU is spent on, from the workers' perf stacks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..bundle.read import PerfSamples
from .frames import BLAS_IDLE, KERNEL_DSO, OPENMP_DSOS, OPENMP_WAIT, aten_kernel, kernel_kind

WORK, SPIN, KERNEL, OTHER = "work", "spin", "kernel", "other"


@dataclass(frozen=True)
class Activity:
    samples: int
    shares: dict[str, float]  # work, spin, kernel, other: fractions of the workers' samples
    kernel_kinds: dict[str, float]  # page_faults, tlb, scheduler, other_kernel: of all samples
    top_work: tuple[tuple[str, float], ...]  # (ATen kernel or symbol, share of all samples)


def classify_stack(perf: PerfSamples, stack_id: int) -> tuple[str, str]:
    """(category, detail) of one stack, leaf first: the kernel, the runtime, then the work."""
    frames = [perf.frames[i] for i in perf.stacks[stack_id]]
    if not frames:
        return OTHER, "empty"
    leaf_symbol, leaf_dso = frames[-1]
    if leaf_dso == KERNEL_DSO:
        kernel_names = [s for s, d in frames if d == KERNEL_DSO]
        user = [(s, d) for s, d in frames if d != KERNEL_DSO]
        # A futex sleep entered from the OpenMP runtime is the barrier's wait, not kernel work;
        # OpenBLAS's idle loop yielding the CPU is its pool idling.
        if user and kernel_kind(kernel_names) == "scheduler":
            if OPENMP_DSOS.search(user[-1][1]) or OPENMP_WAIT.search(user[-1][0]):
                return SPIN, "barrier wait (futex)"
            if BLAS_IDLE.search(user[-1][0]):
                return SPIN, "idle loop (yield)"
        return KERNEL, kernel_kind(kernel_names)
    if OPENMP_DSOS.search(leaf_dso) or OPENMP_WAIT.search(leaf_symbol):
        return SPIN, leaf_symbol
    if BLAS_IDLE.search(leaf_symbol):
        return SPIN, leaf_symbol
    for symbol, _dso in reversed(frames):
        kernel = aten_kernel(symbol)
        if kernel:
            return WORK, kernel
    if leaf_symbol in ("[unknown]", "") and leaf_dso in ("[unknown]", ""):
        return OTHER, "unknown"
    return WORK, leaf_symbol.split("(")[0][:80]


def pool_activity(
    perf: PerfSamples, workers: set[int] | frozenset[int], window: tuple[int, int]
) -> Activity:
    mask = np.isin(perf.tid, list(workers)) & (perf.t_ns >= window[0]) & (perf.t_ns <= window[1])
    stacks = perf.stack[mask]
    total = len(stacks)
    if total == 0:
        return Activity(0, {WORK: 0.0, SPIN: 0.0, KERNEL: 0.0, OTHER: 0.0}, {}, ())
    categories: Counter[str] = Counter()
    details: Counter[tuple[str, str]] = Counter()
    ids, counts = np.unique(stacks, return_counts=True)
    for stack_id, count in zip(ids, counts, strict=True):
        category, detail = classify_stack(perf, int(stack_id))
        categories[category] += int(count)
        details[(category, detail)] += int(count)
    shares = {c: categories[c] / total for c in (WORK, SPIN, KERNEL, OTHER)}
    kinds = {d: n / total for (c, d), n in details.items() if c == KERNEL}
    top = tuple((d, n / total) for (c, d), n in details.most_common() if c == WORK)[:5]
    return Activity(total, shares, kinds, top)
