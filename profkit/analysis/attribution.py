"""Which Python call site, through which ATen op, made the pool burn its CPU.

Sampled method (the eBPF sampler): each on-CPU sample of a pool worker carries the Python stack
its dispatcher was in at that instant, read from the dispatcher's thread state; the pool's CPU
splits over the sites as its samples do, with a 95% interval (binomial, or from blocks of the
window where the samples come in bursts). It needs no probe per region, so it holds at any
region rate; it is used where no region carries a stack in the window (the region probes came
off), and where the probes ran only fraction of the window and its regions bound no split (the
stack method's interval is 100%). A worker spinning after a region is sampled wherever its
dispatcher is by then; see by_samples.

Stack method (the eBPF walker read the dispatching thread's Python stack at each region entry):
every region names its own call site, the innermost Python frame of its stack, and the workers'
on-CPU time from the region's start to the next region's start goes to that site. Regions
without a stack (a thread the walker did not know yet, a failed read) are spread over the
stacked ones in proportion, and their share widens the interval. Where the probes ran the
whole window, this method places the shares.

Aligned method (eBPF regions and py-spy on one clock): a py-spy sample of the dispatching thread
taken inside a region, whose native stack is in the OpenMP runtime, names that region's call
site; every worker's on-CPU time from the region's start to the next region's start (the work
and the spin that follows it) goes to that site. Regions no sample landed in are spread over the
labelled sites in proportion. Proportional method (no regions): pool CPU is split by the count
of in-region py-spy samples per site, with a binomial 95% interval as its uncertainty.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..bundle.read import (
    DISPATCH_HOW,
    DispatchedSamples,
    EbpfData,
    Frame,
    PerfSamples,
    PythonSamples,
)
from .activity import SPIN, WORK, classify_stack
from .frames import KERNEL_DSO, KERNEL_OPS, OPENMP_DSOS, aten_op, is_openmp_frame, user_frame

# py-spy stamps a sample after unwinding it, a little after the moment the thread was stopped.
# How the pool's CPU was split over the sites: by the walker's stack per region, by the
# workers' eBPF samples with their dispatcher's stack, by py-spy samples aligned to the regions,
# in proportion to py-spy's samples, or not at all.
AttributionMethod = Literal["stack", "sampled", "aligned", "proportional", "none"]
ALIGN_TOLERANCE_NS = 3_000_000
# Fewer worker samples than this with their dispatcher's stack give no sampled attribution:
# the interval of a share would be wider than the share.
MIN_DISPATCHED_SAMPLES = 20
# A --nonblocking sample is read without stopping the thread: its stamp is close to its time.
NONBLOCKING_TOLERANCE_NS = 500_000


@dataclass(frozen=True)
class SiteShare:
    site: Frame
    op: str | None
    op_source: str
    share: float
    pool_cores: float
    regions: int
    samples: int
    code: str | None
    stack: tuple[Frame, ...] = ()  # the site's Python stack, outermost first (stack method)

    @property
    def user(self) -> Frame | None:
        """The program's own line that led to the site (frames.user_frame), where the site's
        stack is known and has one."""
        return user_frame(self.stack)


@dataclass(frozen=True)
class Attribution:
    method: AttributionMethod
    reason: str
    uncertainty: float  # in share units, 0..1
    labelled_share: float  # stack/aligned: fraction of pool CPU in regions with a known site
    sites: tuple[SiteShare, ...]
    regions: int = 0  # regions of the dispatching threads in the window
    regions_with_stack: int = 0  # of them, those the eBPF walker read a Python stack for


@dataclass(frozen=True)
class StackInfo:
    in_region: bool
    site: Frame | None
    op: str | None


def stack_info(spans: PythonSamples, stack_id: int) -> StackInfo:
    frames = [spans.frames[i] for i in spans.stacks[stack_id]]
    in_region = any(is_openmp_frame(f.function, f.file) for f in frames)
    python = [f for f in frames if f.is_python]
    site = python[-1].located() if python else None
    return StackInfo(in_region, site, aten_op([f.function for f in frames]))


def expand_weighted(
    spans: PythonSamples, tids: set[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tid, time, stack, seconds) of every sample inside the merged py-spy spans."""
    mask = np.isin(spans.tid, list(tids))
    start = spans.start_ns[mask]
    rates = np.where(spans.span_rate_hz[mask] > 0, spans.span_rate_hz[mask], spans.rate_hz)
    interval = 1e9 / np.maximum(1, rates)
    counts = span_sample_counts(spans, mask)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    step = np.repeat(interval, counts)
    times = np.repeat(start, counts) + (offsets * step).astype(np.int64)
    return (
        np.repeat(spans.tid[mask], counts),
        times,
        np.repeat(spans.stack[mask], counts),
        step / 1e9,
    )


def expand_samples(
    spans: PythonSamples, tids: set[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tid, time, stack) of every sample inside the merged py-spy spans of these threads."""
    tid, times, stacks, _ = expand_weighted(spans, tids)
    return tid, times, stacks


def span_sample_counts(spans: PythonSamples, mask: np.ndarray) -> np.ndarray:
    """How many samples each selected span stands for, at its own rate."""
    rates = np.where(spans.span_rate_hz[mask] > 0, spans.span_rate_hz[mask], spans.rate_hz)
    interval = 1e9 / np.maximum(1, rates)
    spans_ns = spans.end_ns[mask] - spans.start_ns[mask]
    return np.maximum(1, np.rint(spans_ns / interval)).astype(np.int64)


def _inside_regions(sched: EbpfData, times: np.ndarray, tolerance: int) -> np.ndarray:
    order = np.argsort(sched.region_start)
    starts, ends = sched.region_start[order], sched.region_end[order]
    index = np.searchsorted(starts, times + tolerance, side="right") - 1
    valid = index >= 0
    inside = np.zeros(len(times), dtype=bool)
    inside[valid] = times[valid] <= ends[index[valid]] + tolerance
    return inside


def _worker_time_per_region(
    sched: EbpfData, workers: set[int], starts: np.ndarray, window: tuple[int, int]
) -> np.ndarray:
    """The workers' on-CPU time from each region's start to the next region's start (ns). A
    slice that spans several regions is split among them: a worker that spins between regions
    stays on its CPU across many of them in one slice."""
    mask = (
        np.isin(sched.slice_tid, list(workers))
        & (sched.slice_end > window[0])
        & (sched.slice_start < window[1])
    )
    begin = np.maximum(sched.slice_start[mask], window[0])
    finish = np.minimum(sched.slice_end[mask], window[1])
    weights = np.zeros(len(starts))
    if not len(starts):
        return weights
    # Worker time before the first region seen belongs to a region that started before it: of
    # the window, or, where the probes were switched, of the on-time (not the last region of
    # an earlier one).
    opened = np.full(len(begin), window[0], dtype=np.int64)
    if sched.region_on:
        begin, finish, opened = _clip(begin, finish, sched.region_on)
    first = np.searchsorted(starts, opened, side="left")
    seen = first < len(starts)
    begin = np.maximum(begin[seen], starts[first[seen]])
    finish = finish[seen]
    keep = finish > begin
    begin, finish = begin[keep], finish[keep]
    low = np.searchsorted(starts, begin, side="right") - 1
    high = np.searchsorted(starts, finish - 1, side="right") - 1
    size = len(starts)
    one = low == high
    weights += np.bincount(low[one], weights=(finish - begin)[one], minlength=size)
    split = ~one
    after = starts[np.minimum(low[split] + 1, size - 1)]
    weights += np.bincount(low[split], weights=(after - begin[split]), minlength=size)
    weights += np.bincount(
        high[split], weights=(finish[split] - starts[high[split]]), minlength=size
    )
    # The regions a slice covers whole, between its first and last.
    covered = np.cumsum(
        np.bincount(low[split] + 1, minlength=size + 1)
        - np.bincount(high[split], minlength=size + 1)
    )[:size]
    weights[:-1] += covered[:-1] * np.diff(starts)
    return weights


def _clip(
    begin: np.ndarray, finish: np.ndarray, intervals: tuple[tuple[int, int], ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts of the spans [begin, finish) that lie inside the intervals, and where the
    interval of each part opened."""
    pieces = [(np.maximum(begin, a), np.minimum(finish, b)) for a, b in intervals]
    starts = np.concatenate([p[0] for p in pieces]) if pieces else begin[:0]
    ends = np.concatenate([p[1] for p in pieces]) if pieces else finish[:0]
    opened = np.concatenate([np.full(len(begin), a) for a, _ in intervals]) if pieces else begin[:0]
    keep = ends > starts
    return starts[keep], ends[keep], opened[keep]


def probed_fraction(sched: EbpfData, window: tuple[int, int]) -> float:
    """The fraction of the window the region probes were on: 1 unless they were switched."""
    if not sched.region_on or window[1] <= window[0]:
        return 1.0
    inside = sum(max(0, min(b, window[1]) - max(a, window[0])) for a, b in sched.region_on)
    return min(1.0, inside / (window[1] - window[0]))


def resolve_op(
    ops: Counter[str | None], kernels: list[str], code: str | None
) -> tuple[str | None, str]:
    named = [(op, n) for op, n in ops.most_common() if op]
    if named:
        return named[0][0], "dispatcher's native stack"
    for kernel in kernels:
        if kernel in KERNEL_OPS:
            return KERNEL_OPS[kernel], f"worker kernel {kernel}"
    if code:
        # In a chain such as torch.frombuffer(buf).copy_(src.reshape(-1)) the last call outside
        # any argument list is the one that runs on the tensor the others built.
        calls = outer_calls(code)
        if calls:
            return f"aten::{calls[-1]}", "source line"
    return None, "unknown"


def outer_calls(code: str) -> list[str]:
    """Method names called at the line's top level (not inside another call's arguments)."""
    calls, depth = [], 0
    for match in re.finditer(r"\.(\w+)\(|[()]", code):
        if match.group(1) is not None:
            if depth == 0:
                calls.append(match.group(1))
            depth += 1
        elif match.group(0) == "(":
            depth += 1
        else:
            depth = max(0, depth - 1)
    return calls


def native_command(pid: int | None, budget: float | None) -> str:
    """The one command that places the pool where py-spy ran --nonblocking and no eBPF probe
    ran: py-spy --native, at the --budget its stops need (where the capture computed it)."""
    command = f"profkit attach --pid {pid if pid is not None else 'PID'} --pyspy-mode native"
    if budget:
        command += f" --budget {100 * budget:g}"
    return f"`{command}` would place it (py-spy then stops the target for each sample)"


def attribute(
    spans: PythonSamples | None,
    sched: EbpfData | None,
    dispatchers: set[int],
    workers: set[int],
    pool_cores: float,
    window: tuple[int, int],
    worker_kernels: list[str],
    native_samples: PerfSamples | None = None,
    command: str = "",
) -> Attribution:
    """command: what would place the pool where nothing here can (native_command)."""
    if sched is not None and sched.python_stacks:
        stacked = by_stack(
            sched, dispatchers, workers, pool_cores, window, worker_kernels, native_samples
        )
        # Regions with their stacks place the pool's CPU exactly where the probes ran; where
        # the probes came off (too many regions for the budget), the workers' own samples,
        # which carry their dispatcher's stack at any region rate, do. Where the probes ran
        # fraction of the window and its regions bound no split at all (a few regions of a short
        # on-time), the samples place the shares if they bound it, and the region counts stay.
        # Otherwise the regions do: they give a worker's spin after a region to that region's
        # site, where a sample of the spin names whatever line its dispatcher has moved on to.
        if stacked is not None and (
            stacked.uncertainty < 1.0 or probed_fraction(sched, window) >= 1.0
        ):
            return stacked
        sampled = by_samples(
            sched, workers, pool_cores, window, worker_kernels, stacked, native_samples
        )
        if sampled is not None and (stacked is None or sampled.uncertainty < 1.0):
            return sampled
        if stacked is not None:
            return stacked
    if spans is None:
        return Attribution(
            "none", "no py-spy samples: the dispatching Python code is unknown", 1.0, 0.0, ()
        )
    tids = dispatchers or {int(t) for t in np.unique(spans.tid)}
    tid, times, stacks = expand_samples(spans, tids)
    selected = np.isin(spans.tid, list(tids))
    native = np.repeat(spans.span_native[selected], span_sample_counts(spans, selected))
    keep = (times >= window[0]) & (times <= window[1])
    tid, times, stacks, native = tid[keep], times[keep], stacks[keep], native[keep]
    infos = {int(s): stack_info(spans, int(s)) for s in np.unique(stacks)}
    has_site = np.array([infos[int(s)].site is not None for s in stacks], dtype=bool)
    # Native samples show the OpenMP runtime in their stack; --nonblocking ones have no native
    # frames, so whether they were taken inside a region is read from the region probes' times.
    in_region = has_site & np.array([infos[int(s)].in_region for s in stacks], dtype=bool)
    if (native == 0).any() and sched is not None and len(sched.region_start):
        inside = _inside_regions(sched, times, NONBLOCKING_TOLERANCE_NS)
        in_region |= has_site & (native == 0) & inside
    if not in_region.any():
        probes = sched is not None and sched.uprobes_attached and len(sched.region_start) > 0
        reason = (
            "no py-spy sample of the dispatcher fell inside a parallel region (raise --rate "
            "or capture longer)"
            if probes or native.any()
            # Neither native frames nor region times: nothing can place a sample in a region.
            else "the eBPF walker's on-CPU samples have no native frames and no OpenMP region "
            "probe ran, so no sample can be placed inside a parallel region; the region probes "
            "(a larger --budget) or py-spy's native stacks (--collectors adds pyspy) would"
            if spans.source == "ebpf"
            else "py-spy sampled --nonblocking (no native frames) and no OpenMP region probe "
            "ran, so no sample can be placed inside a parallel region; "
            + (command or native_command(None, None))
        )
        return Attribution("none", reason, 1.0, 0.0, ())
    sample_infos = [infos[int(s)] for s in stacks[in_region]]
    # in_region implies has_site: every sample here has a site, none is dropped.
    sample_sites = [info.site for info in sample_infos if info.site is not None]
    sample_ops = [info.op for info in sample_infos]
    site_samples = Counter(sample_sites)
    ops_by_site: dict[Frame, Counter[str | None]] = {}
    for site, op in zip(sample_sites, sample_ops, strict=True):
        ops_by_site.setdefault(site, Counter())[op] += 1
    weights, regions_by_site, method, reason, labelled = _aligned(
        sched, tid[in_region], times[in_region], sample_sites, dispatchers, workers, window
    )
    if not weights:
        method, labelled = "proportional", 0.0
        weights = {site: float(n) for site, n in site_samples.items()}
        regions_by_site = {}
    total = sum(weights.values()) or 1.0
    n = sum(site_samples.values())
    shares = {site: w / total for site, w in weights.items()}
    uncertainty = max(1.96 * math.sqrt(p * (1 - p) / n) for p in shares.values())
    if method == "aligned":
        uncertainty = max(uncertainty * (1 - labelled), 0.0)
    sites = []
    for site, share in sorted(shares.items(), key=lambda item: -item[1]):
        code = spans.sources.get(f"{site.file}:{site.line}")
        op, op_source = resolve_op(ops_by_site.get(site, Counter()), worker_kernels, code)
        sites.append(
            SiteShare(
                site,
                op,
                op_source,
                share,
                share * pool_cores,
                regions_by_site.get(site, 0),
                site_samples.get(site, 0),
                code,
            )
        )
    return Attribution(method, reason, uncertainty, labelled, tuple(sites))


def _aligned(
    sched: EbpfData | None,
    tids: np.ndarray,
    times: np.ndarray,
    sites: Sequence[Frame | None],
    dispatchers: set[int],
    workers: set[int],
    window: tuple[int, int],
) -> tuple[dict[Frame, float], dict[Frame, int], AttributionMethod, str, float]:
    if sched is None or not sched.uprobes_attached or len(sched.region_start) == 0:
        return {}, {}, "proportional", "no OpenMP region probes: split by sampled call sites", 0.0
    mask = (sched.region_start >= window[0]) & (sched.region_start <= window[1])
    if dispatchers:
        mask &= np.isin(sched.region_tid, list(dispatchers))
    order = np.argsort(sched.region_start[mask])
    starts = sched.region_start[mask][order]
    ends = sched.region_end[mask][order]
    if len(starts) == 0:
        return {}, {}, "proportional", "no region from the dispatching threads", 0.0
    region_sites: dict[int, Counter[Frame]] = {}
    index = np.searchsorted(starts, times + ALIGN_TOLERANCE_NS, side="right") - 1
    for i, (region, t) in enumerate(zip(index, times, strict=True)):
        sample_site = sites[i]
        if region >= 0 and t <= ends[region] + ALIGN_TOLERANCE_NS and sample_site is not None:
            region_sites.setdefault(int(region), Counter())[sample_site] += 1
    if not region_sites:
        return {}, {}, "proportional", "no py-spy sample aligned with a region", 0.0
    if len(sched.slice_tid):
        worker_ns = _worker_time_per_region(sched, workers, starts, window)
    else:
        # Scheduler not traced: weigh each region by its length, as a whole team runs it.
        worker_ns = (np.minimum(ends, window[1]) - np.maximum(starts, window[0])).astype(float)
    weights: dict[Frame, float] = {}
    regions_by_site: Counter[Frame] = Counter()
    for region, votes in region_sites.items():
        site = votes.most_common(1)[0][0]
        weights[site] = weights.get(site, 0.0) + float(worker_ns[region])
        regions_by_site[site] += 1
    total = float(worker_ns.sum()) or 1.0
    labelled = sum(weights.values()) / total
    reason = (
        f"{len(region_sites)} of {len(starts)} regions carry a sampled call site; the rest "
        "is spread in proportion"
    )
    if not len(sched.slice_tid):
        reason += " (regions weighed by length: the scheduler was not traced)"
    return weights, dict(regions_by_site), "aligned", reason, labelled


def _regions_in_window(
    sched: EbpfData, dispatchers: set[int], window: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, stack index) of the dispatchers' regions that start in the window, in
    start order."""
    mask = (sched.region_start >= window[0]) & (sched.region_start <= window[1])
    if dispatchers:
        mask &= np.isin(sched.region_tid, list(dispatchers))
    order = np.argsort(sched.region_start[mask], kind="stable")
    return (
        sched.region_start[mask][order],
        sched.region_end[mask][order],
        sched.stacks_of_regions()[mask][order],
    )


def _kernels_in_regions(
    native: PerfSamples | None,
    workers: set[int],
    starts: np.ndarray,
    ends: np.ndarray,
    sites: list[Frame | None],
) -> dict[Frame, Counter[str]]:
    """What the workers worked in (an ATen kernel's name where their native stack shows one)
    inside each site's regions: per site, so that a small copy elsewhere in a model does not
    name a matrix product's op."""
    out: dict[Frame, Counter[str]] = {}
    if native is None or not len(starts):
        return out
    mask = np.isin(native.tid, list(workers))
    kinds: dict[int, str | None] = {}
    for t, stack in zip(native.t_ns[mask], native.stack[mask], strict=True):
        at = int(np.searchsorted(starts, t, side="right")) - 1
        if at < 0 or t > ends[at] or sites[at] is None:
            continue
        if int(stack) not in kinds:
            category, detail = classify_stack(native, int(stack))
            kinds[int(stack)] = detail if category == WORK else None
        kernel = kinds[int(stack)]
        site = sites[at]
        if kernel and site is not None:
            out.setdefault(site, Counter())[kernel] += 1
    return out


def by_stack(
    sched: EbpfData,
    dispatchers: set[int],
    workers: set[int],
    pool_cores: float,
    window: tuple[int, int],
    worker_kernels: list[str],
    native: PerfSamples | None = None,
) -> Attribution | None:
    """Each region's worker time to the innermost Python frame of the stack it was
    dispatched from; None when no region in the window carries a stack."""
    starts, ends, stacks = _regions_in_window(sched, dispatchers, window)
    known = stacks >= 0
    if not known.any():
        return None
    sampled = (
        None if len(sched.slice_tid) else _worker_samples_per_region(sched, workers, starts, ends)
    )
    if len(sched.slice_tid):
        worker_ns = _worker_time_per_region(sched, workers, starts, window)
        weighed = ""
    elif sampled is not None and sched.dispatched is not None:
        worker_ns = sampled
        count = round(float(sampled.sum()) * sched.dispatched.rate_hz / 1e9)
        weighed = (
            f" (regions weighed by their workers' {count} on-CPU samples inside them: the "
            "scheduler was not traced)"
        )
    else:
        worker_ns = (np.minimum(ends, window[1]) - np.maximum(starts, window[0])).astype(float)
        weighed = " (regions weighed by length: the scheduler was not traced)"
    site_of: dict[int, Frame] = {}
    for index in np.unique(stacks[known]):
        frames = sched.python_stacks[int(index)].frames
        inner = frames[-1]
        site_of[int(index)] = inner.located()
    weights: dict[Frame, float] = {}
    regions: Counter[Frame] = Counter()
    # The stack that dispatched most of a site's regions stands for the site.
    stack_regions: dict[Frame, Counter[int]] = {}
    for index, ns in zip(stacks[known], worker_ns[known], strict=True):
        site = site_of[int(index)]
        weights[site] = weights.get(site, 0.0) + float(ns)
        regions[site] += 1
        stack_regions.setdefault(site, Counter())[int(index)] += 1
    total = float(worker_ns.sum()) or 1.0
    labelled = sum(weights.values()) / total
    kernels = _kernels_in_regions(
        native, workers, starts, ends, [site_of.get(int(i)) if i >= 0 else None for i in stacks]
    )
    if sum(weights.values()) <= 0:
        # Regions were seen but no worker time fell in them: count regions instead.
        weights = {site: float(n) for site, n in regions.items()}
        labelled = float(known.sum()) / len(stacks)
    shares_total = sum(weights.values()) or 1.0
    sites = []
    for site, weight in sorted(weights.items(), key=lambda item: -item[1]):
        share = weight / shares_total
        stack = sched.python_stacks[stack_regions[site].most_common(1)[0][0]].frames
        code = stack[-1].code
        # The site's own workers' kernel where their native stacks were read, as by_samples.
        own = [kernels[site].most_common(1)[0][0]] if site in kernels else None
        op, op_source = resolve_op(Counter(), worker_kernels if own is None else own, code)
        sites.append(
            SiteShare(site, op, op_source, share, share * pool_cores, regions[site], 0, code, stack)
        )
    interval = _region_interval(
        starts[known], worker_ns[known], [site_of[int(i)] for i in stacks[known]]
    )
    probed = probed_fraction(sched, window)
    reason = (
        f"{int(known.sum())} of {len(stacks)} regions carry their Python stack (eBPF walker)"
        + ("" if known.all() else "; the rest is spread in proportion")
        + weighed
        + (
            f"; the region probes were on {100 * probed:.0f}% of the window, to fit the budget"
            if probed < 1.0
            else ""
        )
        + ("; too few regions to bound the split" if interval >= 1.0 else "")
    )
    return Attribution(
        "stack",
        reason,
        min(1.0, interval + max(0.0, 1.0 - labelled)),
        labelled,
        tuple(sites),
        regions=len(stacks),
        regions_with_stack=int(known.sum()),
    )


# Fewer in-region worker samples than this: the regions are weighed by length instead.
MIN_REGION_SAMPLES = 50


def _worker_samples_per_region(
    sched: EbpfData, workers: set[int], starts: np.ndarray, ends: np.ndarray
) -> np.ndarray | None:
    """Each region's worker CPU from the eBPF sampler's samples of the pool's workers inside it
    (ns, at the sampling period), where the scheduler was not traced. A region's length takes
    in whatever stopped the pool meanwhile (a CPU quota's throttled gap: 88 ms of each 100 in a
    2-core quota with 16 threads); a cpu-clock sample is taken only on a CPU. None with too few
    samples inside regions."""
    samples = sched.dispatched
    if samples is None or not len(samples.t_ns) or not len(starts) or samples.rate_hz <= 0:
        return None
    mine = np.isin(samples.tid, list(workers)) if workers else np.ones(len(samples.tid), bool)
    times = samples.t_ns[mine]
    index = np.searchsorted(starts, times, side="right") - 1
    inside = (index >= 0) & (times <= ends[np.clip(index, 0, len(ends) - 1)])
    if int(inside.sum()) < MIN_REGION_SAMPLES:
        return None
    period_ns = 1e9 / samples.rate_hz
    return np.bincount(index[inside], minlength=len(starts)).astype(float) * period_ns


def _region_interval(starts: np.ndarray, weights: np.ndarray, sites: list[Frame]) -> float:
    """A 95% interval of the largest share of a split by regions. Every region is counted, but
    their weights are not a fixed truth: a region's length takes in a throttled gap of a CPU
    quota, and a worker's time the spin after it, unevenly. The regions, in time order, are cut
    into groups; the groups' shares vary as much as the split really does (batch means). 1 with
    too few regions to form five groups of two."""
    groups = min(INTERVAL_BLOCKS, len(starts) // 2)
    if groups < 5:
        return 1.0
    columns = {site: i for i, site in enumerate(dict.fromkeys(sites))}
    order = np.argsort(starts, kind="stable")
    column = np.array([columns[site] for site in sites])[order]
    weight = weights[order]
    shares = []
    for chunk in np.array_split(np.arange(len(order)), groups):
        total = float(weight[chunk].sum())
        if total > 0:
            shares.append(
                np.bincount(column[chunk], weights=weight[chunk], minlength=len(columns)) / total
            )
    if len(shares) < 5:
        return 1.0
    spread = np.std(np.array(shares), axis=0, ddof=1) / math.sqrt(len(shares))
    t95 = 2.09 if len(shares) >= 20 else 2.26 if len(shares) >= 10 else 2.78  # Student's t, 95%
    return float(min(1.0, t95 * spread.max()))


def _in_runtime(native: PerfSamples, stack: int) -> bool:
    """A sample caught in the pool runtime: spinning, or in the kernel on the runtime's behalf
    (a futex wait, a syscall's return) rather than for the work."""
    if classify_stack(native, stack)[0] == SPIN:
        return True
    user = [(symbol, dso) for symbol, dso in (native.frames[i] for i in native.stacks[stack])]
    user = [frame for frame in user if frame[1] not in (KERNEL_DSO, "[unknown]")]
    return bool(user) and bool(OPENMP_DSOS.search(user[-1][1]))


def _native_kinds(
    dispatched: DispatchedSamples, native: PerfSamples | None
) -> tuple[np.ndarray, list[str | None]]:
    """For each sample, from the same sample's native stack (the eBPF sampler takes both at
    once): whether it caught its worker in the runtime rather than at work, and what it was
    working in (an ATen kernel's name where one is on the stack). Nothing where there are no
    such stacks."""
    count = len(dispatched.t_ns)
    spinning = np.zeros(count, dtype=bool)
    work: list[str | None] = [None] * count
    if native is None or native.source != "eBPF":
        return spinning, work
    stack_at = {
        (int(tid), int(t)): int(stack)
        for tid, t, stack in zip(native.tid, native.t_ns, native.stack, strict=True)
    }
    kinds: dict[int, tuple[bool, str | None]] = {}
    for i, (tid, t) in enumerate(zip(dispatched.tid, dispatched.t_ns, strict=True)):
        stack = stack_at.get((int(tid), int(t)))
        if stack is None:
            continue
        if stack not in kinds:
            category, detail = classify_stack(native, stack)
            kinds[stack] = (_in_runtime(native, stack), detail if category == WORK else None)
        spinning[i], work[i] = kinds[stack]
    return spinning, work


# The window is cut into this many blocks for the batch-means interval.
INTERVAL_BLOCKS = 20


def _batch_interval(
    placed: list[tuple[int, Frame]], sites: list[Frame], window: tuple[int, int]
) -> float:
    """A 95% interval of the largest share that holds when samples come in bursts: workers
    sampled at one tick sit in one region, and a CPU quota runs the pool in short bursts, so
    the samples are not independent draws and the binomial interval is too narrow. The shares
    of blocks of the window vary as much as the samples really do (batch means); 0 with too
    few blocks to tell."""
    span = window[1] - window[0]
    if span <= 0 or len(placed) < 2 * INTERVAL_BLOCKS:
        return 0.0
    counts = np.zeros((INTERVAL_BLOCKS, len(sites)))
    column = {site: i for i, site in enumerate(sites)}
    for t, site in placed:
        block = min(INTERVAL_BLOCKS - 1, max(0, (t - window[0]) * INTERVAL_BLOCKS // span))
        counts[block, column[site]] += 1
    totals = counts.sum(axis=1)
    used = totals > 0
    if used.sum() < 5:
        return 0.0
    shares = counts[used] / totals[used, None]
    spread = shares.std(axis=0, ddof=1) / math.sqrt(int(used.sum()))
    blocks = int(used.sum())
    t95 = 2.09 if blocks >= 20 else 2.26 if blocks >= 10 else 2.78  # Student's t, 95%
    return float(t95 * spread.max())


def by_samples(
    sched: EbpfData,
    workers: set[int],
    pool_cores: float,
    window: tuple[int, int],
    worker_kernels: list[str],
    regions_seen: Attribution | None = None,
    native: PerfSamples | None = None,
) -> Attribution | None:
    """The workers' on-CPU samples to the innermost Python frame of their dispatcher's stack
    at each sample; None with too few such samples. A sample whose dispatcher is unknown
    (several Python threads and no wakeup seen) or whose walk failed is spread in proportion,
    and its part widens the interval, as the sample count's binomial interval does.

    A worker that spins after its region is sampled while its dispatcher has moved on, to the
    next region's line or to a sleep between requests. Where the native stacks show the spin,
    a spinning sample counts for its dispatcher's line only if working samples were seen
    there too (a line that dispatches regions); the others are spread as the rest, as the
    stack method gives a region the spin that follows it. Where the region probes ran part of
    the window, the lines they saw dispatch are the only sites."""
    dispatched = sched.dispatched
    if dispatched is None or not workers:
        return None
    mask = (
        np.isin(dispatched.tid, list(workers))
        & (dispatched.t_ns >= window[0])
        & (dispatched.t_ns <= window[1])
    )
    taken = int(mask.sum())
    stacks = sched.python_stacks
    known = mask & (dispatched.stack >= 0) & (dispatched.stack < len(stacks))
    spinning, work_of = _native_kinds(dispatched, native)

    def site_of(index: int) -> Frame | None:
        frames = stacks[index].frames
        return frames[-1].located() if frames else None

    sites_of = {int(i): site_of(int(i)) for i in np.unique(dispatched.stack[known])}
    working = {sites_of[int(i)] for i in dispatched.stack[known & ~spinning] if sites_of[int(i)]}
    # Where the region probes ran, they saw which lines dispatch: a sample counted as work at
    # another line (a lock in the C library, a stack that did not unwind) does not make a
    # sleep a site, nor the spin there its share.
    seen = {share.site for share in regions_seen.sites} if regions_seen is not None else set()
    by_site: dict[Frame, Counter[int]] = {}
    kernels: dict[Frame, Counter[str]] = {}  # what each site's workers were working in
    spread = 0  # spinning while the dispatcher was at a line that dispatches nothing
    unseen = 0  # at a line the region probes never saw dispatch
    placed: list[tuple[int, Frame]] = []  # (time, site) of each sample that counts
    for i in np.flatnonzero(known):
        site = sites_of[int(dispatched.stack[i])]
        if site is None or (spinning[i] and site not in working):
            spread += int(spinning[i])
            continue
        if seen and site not in seen:
            unseen += 1
            continue
        by_site.setdefault(site, Counter())[int(dispatched.stack[i])] += 1
        placed.append((int(dispatched.t_ns[i]), site))
        if work_of[i]:
            kernels.setdefault(site, Counter())[str(work_of[i])] += 1
    n = sum(sum(counts.values()) for counts in by_site.values())
    if n < MIN_DISPATCHED_SAMPLES:
        return None
    labelled = n / taken
    shares = {site: sum(counts.values()) / n for site, counts in by_site.items()}
    interval = max(
        max(1.96 * math.sqrt(p * (1 - p) / n) for p in shares.values()),
        _batch_interval(placed, list(shares), window),
    )
    regions_of = {s.site: s.regions for s in regions_seen.sites} if regions_seen else {}
    sites = []
    for site, share in sorted(shares.items(), key=lambda item: -item[1]):
        stack = stacks[by_site[site].most_common(1)[0][0]].frames
        code = stack[-1].code
        # What the site's own workers spent most samples in, where their native stacks were
        # read: the pool's kernels mix every site's, and a small copy inside a matrix product
        # must not name the op.
        own = [kernels[site].most_common(1)[0][0]] if site in kernels else None
        op, op_source = resolve_op(Counter(), worker_kernels if own is None else own, code)
        sites.append(
            SiteShare(
                site,
                op,
                op_source,
                share,
                share * pool_cores,
                regions_of.get(site, 0),
                sum(by_site[site].values()),
                code,
                stack,
            )
        )
    how = Counter(DISPATCH_HOW.get(int(h), "none") for h in dispatched.how[known])
    whose = " and ".join(
        f"{100 * how[key] / max(1, int(known.sum())):.0f}% {text}"
        for key, text in (
            ("woken", "from the Python thread that woke the worker"),
            ("sole", "from the only Python thread"),
        )
        if how[key]
    )
    reason = (
        f"{n} of {taken} worker samples ({dispatched.rate_hz} Hz) placed by their dispatcher's "
        f"Python stack, read at the sample (eBPF sampler): {whose}"
        + (f"; {spread} spinning while the dispatcher was elsewhere" if spread else "")
        + (f"; {unseen} at lines the region probes never saw dispatch" if unseen else "")
        + ("" if n == taken else "; the rest is spread in proportion")
    )
    if regions_seen is not None:
        probed = 100 * probed_fraction(sched, window)
        reason += f"; region counts from the region probes, on {probed:.0f}% of the window"
    elif sched.regions_skipped:
        reason += f"; no region counts ({sched.regions_skipped})"
    return Attribution(
        "sampled",
        reason,
        min(1.0, interval + (1.0 - labelled)),
        labelled,
        tuple(sites),
        regions=regions_seen.regions if regions_seen else 0,
        regions_with_stack=regions_seen.regions_with_stack if regions_seen else 0,
    )
