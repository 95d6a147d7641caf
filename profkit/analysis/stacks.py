"""Weighted stacks for flame graphs and exports, in CPU seconds, for four views.

merged   the process as one tree whose root is the process's CPU: each Python thread's sampled
         stacks (the eBPF walker's or py-spy's) scaled to its /proc CPU; each pool's CPU grafted,
         per dispatching site, under the Python stack that dispatched the site's regions (read
         at each region by the eBPF walker, else the most sampled one) as "[openmp pool xN]"
         with the workers' perf stacks beneath; other threads by name.
python   what py-spy alone shows (every sample, idle included, as py-spy --idle draws it).
workers  the pools' own perf stacks.
offcpu   waiting time: Python threads' idle samples (py-spy), or their time off CPU by the
         stack they left with (the eBPF walker, when the scheduler is traced), and the workers'
         off-CPU time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bundle.read import Frame, PerfSamples, PythonSamples
from .attribution import expand_weighted
from .frames import KERNEL_DSO, OPENMP_DSOS, OPENMP_WAIT, aten_kernel
from .pipeline import Report
from .reconcile import IDLE_LEAF

PYTHON, NATIVE, KERNEL, RUNTIME, WORK, SYNTHETIC = (
    "python",
    "native",
    "kernel",
    "openmp",
    "pool-work",
    "profkit",
)
VIEWS = ("merged", "python", "workers", "offcpu")


@dataclass(frozen=True)
class Node:
    name: str
    kind: str


Stack = tuple[Node, ...]
Weights = dict[Stack, float]  # seconds per stack


@dataclass(frozen=True)
class Stacks:
    view: str
    weights: Weights  # CPU seconds (offcpu: waiting seconds)
    total_seconds: float
    window_seconds: float
    per_thread: dict[str, Weights]


def _py_node(frame: Frame) -> Node:
    if frame.is_truncation:
        return Node(frame.function, SYNTHETIC)
    if frame.is_python:
        short = frame.file.rsplit("/", 1)[-1]
        return Node(f"{frame.function} ({short}:{frame.line})", PYTHON)
    kind = RUNTIME if OPENMP_DSOS.search(frame.file) else NATIVE
    return Node(frame.function, kind)


def _perf_node(symbol: str, dso: str) -> Node:
    if dso == KERNEL_DSO:
        return Node(symbol, KERNEL)
    if OPENMP_DSOS.search(dso) or OPENMP_WAIT.search(symbol):
        return Node(symbol if symbol != "[unknown]" else f"[{dso.rsplit('/', 1)[-1]}]", RUNTIME)
    kernel = aten_kernel(symbol)
    if kernel:
        return Node(f"at::native::{kernel}", WORK)
    return Node(symbol.split("(")[0][:120] or "[unknown]", NATIVE)


def py_thread_stacks(
    spans: PythonSamples, tid: int, window: tuple[int, int], idle: bool | None = None
) -> Weights:
    """Sampled seconds per stack of one thread (idle: only waiting samples, or only active)."""
    _, times, stacks, seconds = expand_weighted(spans, {tid})
    keep = (times >= window[0]) & (times <= window[1])
    totals: Weights = {}
    ids, inverse = np.unique(stacks[keep], return_inverse=True)
    sums = np.bincount(inverse, weights=seconds[keep], minlength=len(ids))
    for stack_id, total in zip(ids, sums, strict=True):
        frames = [spans.frames[i] for i in spans.stacks[int(stack_id)]]
        is_idle = bool(frames) and bool(IDLE_LEAF.search(frames[-1].function))
        if idle is not None and is_idle != idle:
            continue
        stack = tuple(_py_node(f) for f in frames)
        totals[stack] = totals.get(stack, 0) + float(total)
    return totals


def perf_stacks(perf: PerfSamples, tids: set[int], window: tuple[int, int]) -> Weights:
    """Seconds per stack, dropping the thread-start frames above the pool's own work."""
    mask = np.isin(perf.tid, list(tids)) & (perf.t_ns >= window[0]) & (perf.t_ns <= window[1])
    seconds: Weights = {}
    for stack_id, period in zip(perf.stack[mask], perf.period_ns[mask], strict=True):
        nodes = [_perf_node(*perf.frames[i]) for i in perf.stacks[int(stack_id)]]
        while len(nodes) > 1 and nodes[0].name in (
            "[unknown]",
            "clone3",
            "start_thread",
            "__clone3",
            "clone",
        ):
            nodes.pop(0)
        stack = tuple(nodes)
        seconds[stack] = seconds.get(stack, 0) + (int(period) or 10_101_010) / 1e9
    return seconds


def _scale(counts: Weights, total: float) -> Weights:
    size = sum(counts.values())
    return {stack: total * n / size for stack, n in counts.items()} if size else {}


def _add(into: Weights, more: Weights, prefix: Stack = ()) -> None:
    for stack, weight in more.items():
        key = prefix + stack
        into[key] = into.get(key, 0.0) + weight


def build(report: Report, view: str) -> Stacks:
    bundle, recon = report.bundle, report.reconciliation
    window = (report.cpu.start_ns, report.cpu.end_ns)
    seconds = recon.window_seconds
    weights: Weights = {}
    per_thread: dict[str, Weights] = {}
    if view == "python" and bundle.pyspy is not None:
        for tid, name in bundle.pyspy.names.items():
            counts = py_thread_stacks(bundle.pyspy, tid, window)
            thread = dict(counts)
            per_thread[f"{name or 'thread'} ({tid})"] = thread
            _add(weights, thread)
    elif view == "workers" and bundle.perf is not None:
        for pool in report.pools:
            pool_weights = _scale(
                perf_stacks(bundle.perf, set(pool.pool.workers), window), pool.cores * seconds
            )
            head = (Node(f"[{pool.pool.name} pool x{pool.pool.team_size}]", SYNTHETIC),)
            per_thread[f"{pool.pool.name} workers"] = pool_weights
            _add(weights, pool_weights, head)
    elif view == "offcpu":
        _offcpu(report, window, weights, per_thread)
    elif view == "merged":
        _merged(report, window, weights, per_thread)
    total = sum(weights.values())
    return Stacks(view, weights, total, seconds, per_thread)


def _merged(
    report: Report,
    window: tuple[int, int],
    weights: Weights,
    per_thread: dict[str, Weights],
) -> None:
    bundle, recon = report.bundle, report.reconciliation
    seconds = recon.window_seconds
    root = (Node("process", SYNTHETIC),)
    for share in recon.threads:
        if share.role != "python":
            continue
        counts: Weights = {}
        if bundle.pyspy is not None:
            counts = py_thread_stacks(
                bundle.pyspy, share.tid, window, idle=False
            ) or py_thread_stacks(bundle.pyspy, share.tid, window)
        if not counts:
            counts = {(Node(f"[python thread {share.tid}, no samples]", SYNTHETIC),): 1}
        thread = _scale(counts, share.cores * seconds)
        per_thread[f"{share.name} ({share.tid})"] = thread
        _add(weights, thread, root)
    for pool in report.pools:
        pool_seconds = pool.cores * seconds
        worker_counts = (
            perf_stacks(bundle.perf, set(pool.pool.workers), window)
            if bundle.perf is not None
            else {}
        )
        if not worker_counts:
            worker_counts = {(Node("[no native samples]", SYNTHETIC),): 1.0}
        head = Node(f"[{pool.pool.name} pool x{pool.pool.team_size}]", SYNTHETIC)
        sites = pool.attribution.sites
        grafts = [
            (
                s.share,
                # The stack method carries the site's real Python stack from the region probes.
                tuple(_py_node(f) for f in s.stack)
                or _site_stack(bundle.pyspy, s.site.file, s.site.line, window),
            )
            for s in sites
        ] or [(1.0, (Node("[dispatch site unknown]", SYNTHETIC),))]
        pool_tree: Weights = {}
        for site_share, site_stack in grafts:
            _add(pool_tree, _scale(worker_counts, pool_seconds * site_share), (*site_stack, head))
        per_thread[f"{pool.pool.name} workers"] = pool_tree
        _add(weights, pool_tree, root)
    others = [t for t in recon.threads if t.role == "other" and t.cores > 0]
    for share in others:
        _add(
            weights,
            {
                (
                    Node("[other threads]", SYNTHETIC),
                    Node(f"{share.name} ({share.tid})", NATIVE),
                ): share.cores * seconds
            },
            root,
        )
    if recon.unexplained_cores > 0:
        _add(
            weights, {(Node("[unexplained]", SYNTHETIC),): recon.unexplained_cores * seconds}, root
        )


def _site_stack(
    spans: PythonSamples | None, file: str, line: int, window: tuple[int, int]
) -> Stack:
    """The dispatching stack: the most sampled in-region stack ending at this Python line."""
    if spans is None:
        return (Node(f"{file}:{line}", PYTHON),)
    best: Weights = {}
    for tid in spans.names:
        for stack, count in py_thread_stacks(spans, tid, window).items():
            for depth in range(len(stack), 0, -1):
                node = stack[depth - 1]
                if node.kind == PYTHON and node.name.endswith(
                    f"({file.rsplit('/', 1)[-1]}:{line})"
                ):
                    # Keep the native dispatch path down to the OpenMP runtime.
                    tail = stack[depth:]
                    cut = next((i for i, n in enumerate(tail) if n.kind == RUNTIME), len(tail))
                    if any(n.kind == RUNTIME for n in tail):
                        key = stack[:depth] + tail[:cut]
                        best[key] = best.get(key, 0) + count
                    break
    if best:
        # The first of the most sampled, as Counter.most_common(1) picks it.
        return max(best.items(), key=lambda item: item[1])[0]
    return (Node(f"{file.rsplit('/', 1)[-1]}:{line}", PYTHON),)


def _offcpu(
    report: Report,
    window: tuple[int, int],
    weights: Weights,
    per_thread: dict[str, Weights],
) -> None:
    bundle = report.bundle
    if bundle.pyspy is not None and bundle.pyspy.source == "py-spy":
        for tid, name in bundle.pyspy.names.items():
            counts = py_thread_stacks(bundle.pyspy, tid, window, idle=True)
            thread = dict(counts)
            per_thread[f"{name or 'thread'} ({tid})"] = thread
            _add(weights, thread, (Node(f"{name or 'thread'} ({tid})", SYNTHETIC),))
    elif bundle.sched is not None and bundle.sched.python_offcpu:
        # The walker read each Python thread's stack as it left the CPU (scheduler traced).
        names = bundle.pyspy.names if bundle.pyspy is not None else {}
        for tid, index, seconds in bundle.sched.python_offcpu:
            label = f"{names.get(tid) or 'thread'} ({tid})"
            frames = bundle.sched.python_stacks[index].frames
            stack = tuple(_py_node(f) for f in frames)
            thread = per_thread.setdefault(label, {})
            thread[stack] = thread.get(stack, 0.0) + seconds
            _add(weights, {stack: seconds}, (Node(label, SYNTHETIC),))
    if bundle.sched is not None:
        for pool in report.pools:
            waiting: Weights = {}
            for tid in pool.pool.workers:
                times = bundle.sched.threads.get(tid)
                if times:
                    waiting[(Node(f"worker {tid}", NATIVE), Node("[off-CPU]", KERNEL))] = (
                        times["offcpu_ns"] / 1e9
                    )
            per_thread[f"{pool.pool.name} workers"] = waiting
            _add(weights, waiting, (Node(f"[{pool.pool.name} pool]", SYNTHETIC),))
