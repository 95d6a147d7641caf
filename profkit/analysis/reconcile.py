"""Reconciliation: process CPU (the /proc truth) against what py-spy's Python samples explain."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..bundle.read import PerfSamples, PythonSamples
from .attribution import expand_weighted, span_sample_counts
from .cpu import CpuWindow
from .roles import OTHER, PYTHON, WORKER, ThreadRole

IDLE_LEAF = re.compile(
    r"futex|epoll_wait|poll|select|nanosleep|sem_wait|pthread_cond|"
    r"accept|recv|sleep|wait"
)


@dataclass(frozen=True)
class ThreadShare:
    tid: int
    name: str
    role: str
    pool: str | None
    cores: float


@dataclass(frozen=True)
class Reconciliation:
    window_seconds: float
    process_cores: float
    python_sampled_cores: float
    python: float
    native_in_python_threads: float
    pool_workers: float
    other: float
    unexplained_cores: float
    threads: tuple[ThreadShare, ...]

    @property
    def closure_pct(self) -> float:
        if self.process_cores <= 0:
            return 0.0
        return 100.0 * abs(self.unexplained_cores) / self.process_cores


def reconcile(
    cpu: CpuWindow,
    roles: tuple[ThreadRole, ...],
    spans: PythonSamples | None,
    window: tuple[int, int],
    perf: PerfSamples | None = None,
    names: Mapping[int, str] | None = None,
) -> Reconciliation:
    """Split the process's CPU into Python, native-under-Python, pool workers and other threads.

    "py-spy sampled" is the CPU of the threads py-spy can see (the Python threads), over the
    fraction of the window its samples cover: what a perfect py-spy would account for. Within those
    threads, interpreted Python and native code are told apart by perf's on-CPU samples (leaf in
    the interpreter or not) when perf ran, else by py-spy's --native samples (leaf frame Python
    or native, leaving out samples waiting in a blocking call). `names`: what each thread is
    called in the report where the capture knew better than its comm (threading's names).
    """
    by_tid = {r.tid: r for r in roles}
    threads = tuple(
        ThreadShare(
            t.tid,
            (names or {}).get(t.tid) or t.name,
            by_tid[t.tid].role if t.tid in by_tid else OTHER,
            by_tid[t.tid].pool if t.tid in by_tid else None,
            t.cpu_seconds / cpu.seconds,
        )
        for t in cpu.threads
    )
    python_part = native_part = sampled = 0.0
    # A thread without CPU in the window adds nothing to any part (a target can hold thousands).
    for share in (t for t in threads if t.role == PYTHON and t.cores > 0):
        fraction_python, coverage = 1.0, 0.0
        if spans is not None:
            _, times, stacks, seconds = expand_weighted(spans, {share.tid})
            keep = (times >= window[0]) & (times <= window[1])
            coverage = min(1.0, float(seconds[keep].sum()) / cpu.seconds)
            if spans.source == "ebpf":
                # The walker samples every Python thread on CPU for the whole window: its
                # samples add up to the thread's CPU, not to the time it was watched.
                coverage = 1.0 if keep.any() else 0.0
            mine = spans.tid == share.tid
            native = np.repeat(spans.span_native[mine], span_sample_counts(spans, mine))[keep]
            stacks = stacks[keep][native == 1]
            active = [int(s) for s in stacks if not _idle_leaf(spans, int(s))] or [
                int(s) for s in stacks
            ]
            if active:
                fraction_python = float(np.mean([_leaf_is_python(spans, s) for s in active]))
        from_perf = _perf_python_fraction(perf, share.tid, window)
        if from_perf is not None:
            fraction_python = from_perf
        python_part += share.cores * fraction_python
        native_part += share.cores * (1.0 - fraction_python)
        sampled += share.cores * coverage
    pool = sum(t.cores for t in threads if t.role == WORKER)
    other = sum(t.cores for t in threads if t.role == OTHER)
    explained = python_part + native_part + pool + other
    return Reconciliation(
        window_seconds=cpu.seconds,
        process_cores=cpu.process_cores,
        python_sampled_cores=sampled,
        python=python_part,
        native_in_python_threads=native_part,
        pool_workers=pool,
        other=other,
        unexplained_cores=cpu.process_cores - explained,
        threads=tuple(sorted(threads, key=lambda t: -t.cores)),
    )


INTERPRETER = re.compile(r"libpython|/python3(\.\d+)?$|/bin/python")


def _perf_python_fraction(
    perf: PerfSamples | None, tid: int, window: tuple[int, int]
) -> float | None:
    """Share of a thread's on-CPU perf samples whose user-space leaf is the interpreter."""
    if perf is None:
        return None
    mask = (perf.tid == tid) & (perf.t_ns >= window[0]) & (perf.t_ns <= window[1])
    if mask.sum() < 10:
        return None
    interpreted = 0
    for stack_id in perf.stack[mask]:
        user = [
            dso
            for _, dso in (perf.frames[i] for i in perf.stacks[int(stack_id)])
            if dso != "[kernel.kallsyms]"
        ]
        interpreted += bool(user) and bool(INTERPRETER.search(user[-1]))
    return interpreted / int(mask.sum())


def _leaf_is_python(spans: PythonSamples, stack_id: int) -> bool:
    stack = spans.stacks[stack_id]
    return bool(stack) and spans.frames[stack[-1]].is_python


def _idle_leaf(spans: PythonSamples, stack_id: int) -> bool:
    stack = spans.stacks[stack_id]
    return bool(stack) and bool(IDLE_LEAF.search(spans.frames[stack[-1]].function))
