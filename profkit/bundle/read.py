"""Typed, frozen views of a session bundle, loaded once; every analysis step reads these.

Each part is read through load.BundleFiles and each value checked as it is taken, so that a
bundle someone else made gives these views or one BadBundle line naming the part and the key."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np

from ..errors import BadBundle
from .frames import TRUNCATED_ROOT, Frame
from .load import (
    MIN_CORES,
    BundleFiles,
    Fields,
    describe,
    need_below,
    need_ids,
    need_int,
    need_text,
)
from .manifest import Manifest
from .parts import CGROUP, EBPF, NATIVE, OWNER, PERF, PROC, PYSPY

I64 = np.int64
# py-spy at its top rate (1000 Hz) on 8 Python threads for an hour is 2.9e7 samples; analysis
# holds 32 bytes for each.
MAX_SPAN_SAMPLES = 2**26


@dataclass(frozen=True)
class ProcSeries:
    clock_ticks: int
    names: dict[int, str]
    t_ns: np.ndarray
    tid: np.ndarray
    cpu_ticks: np.ndarray  # utime + stime
    process_t_ns: np.ndarray
    process_ticks: np.ndarray
    full_t_ns: np.ndarray  # the sample times at which every thread was read


PythonSource = Literal["py-spy", "ebpf"]
NativeSource = Literal["perf record", "eBPF"]


@dataclass(frozen=True)
class PythonSamples:
    """The target's Python stacks over time: py-spy's spans, or the eBPF walker's on-CPU
    samples in the same shape (one span per sample)."""

    frames: tuple[Frame, ...]
    stacks: tuple[tuple[int, ...], ...]  # root first
    names: dict[int, str]
    tid: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    stack: np.ndarray
    rate_hz: int
    sources: dict[str, str]
    span_rate_hz: np.ndarray  # each span's own rate (py-spy may be restarted at a lower one)
    span_native: np.ndarray  # 1: sampled with --native (native frames present), 0: --nonblocking
    source: PythonSource = "py-spy"


@dataclass(frozen=True)
class PerfSamples:
    frames: tuple[tuple[str, str], ...]  # (symbol, dso)
    stacks: tuple[tuple[int, ...], ...]  # root first
    t_ns: np.ndarray
    tid: np.ndarray
    period_ns: np.ndarray
    stack: np.ndarray
    callgraph: str
    source: NativeSource = "perf record"  # "eBPF": the walker's sampler, without perf record


@dataclass(frozen=True)
class PyStack:
    """A Python stack the eBPF walker read at region entries, outermost frame first."""

    frames: tuple[Frame, ...]
    regions: int
    region_ns: int
    truncated: bool = False


# How a sample's dispatcher was chosen (probes/pystack.bpf.c, DISPATCH_*): none found, the
# Python thread that last woke the sampled thread, or the process's only Python thread.
DISPATCH_HOW = {0: "none", 1: "woken", 2: "sole"}


@dataclass(frozen=True)
class DispatchedSamples:
    """The eBPF sampler's samples of threads that are not Python threads (a pool's workers),
    each with its dispatcher's Python stack as it was at that instant, where it had one."""

    t_ns: np.ndarray
    tid: np.ndarray
    dispatcher: np.ndarray  # the Python thread whose stack the sample carries, 0 for none
    how: np.ndarray  # DISPATCH_HOW's keys
    stack: np.ndarray  # index into EbpfData.python_stacks, -1 where the walk read none
    rate_hz: int


@dataclass(frozen=True)
class EbpfData:
    """Everything the eBPF collector wrote (ebpf.json): scheduler slices and wakeups, parallel
    regions with their Python stacks, the runtimes probed."""

    threads: dict[int, dict[str, int]]
    wakeups: tuple[tuple[int, int, int], ...]
    slice_tid: np.ndarray
    slice_start: np.ndarray
    slice_end: np.ndarray
    slice_voluntary: np.ndarray
    region_tid: np.ndarray
    region_start: np.ndarray
    region_end: np.ndarray
    region_requested: np.ndarray
    lost: int
    uprobes_attached: bool
    scheduler_traced: bool = True  # False when the tracepoints were skipped to fit the budget
    scheduler_skipped: str = ""  # why, where the capture says
    regions_skipped: str = ""  # why the region probes were detached, when they were
    # When the region probes were switched on and off to fit the budget: their on-times (ns).
    # Empty when they stayed on (or off) for the whole capture.
    region_on: tuple[tuple[int, int], ...] = ()
    # Each region's index into python_stacks, -1 where the walker read none.
    region_stack: np.ndarray | None = None
    python_stacks: tuple[PyStack, ...] = ()
    walker: str = "off"  # "on" when the eBPF stack walker ran
    walker_reason: str = ""
    # The target's interpreter as the walker found it: "3.14.10, static (in python3.14), layout
    # from _Py_DebugOffsets"; empty where the bundle does not say.
    python_interpreter: str = ""
    # The pool of the runtime copy that started each region ("openmp", "openblas"; pool_names).
    region_pool: np.ndarray | None = None
    runtimes: tuple[dict, ...] = ()  # every runtime copy probed, by index
    pool_names: tuple[str, ...] = ()  # the pool each runtime copy feeds, by index (pool_names())
    # Python threads' time off CPU by the stack they left with: (tid, stack index, seconds).
    python_offcpu: tuple[tuple[int, int, float], ...] = ()
    dispatched: DispatchedSamples | None = None
    # Which loader ran the programs ("core", "bcc"; empty in bundles that do not say), its
    # version and why it was the one.
    loader: str = ""
    loader_version: str = ""
    loader_reason: str = ""

    def for_pool(self, pool: str) -> EbpfData:
        """The same data with only the regions of this pool's runtimes."""
        if self.region_pool is None:
            if pool == "openmp":
                return self
            keep = np.zeros(len(self.region_start), dtype=bool)
        else:
            keep = self.region_pool == pool
        return replace(
            self,
            region_tid=self.region_tid[keep],
            region_start=self.region_start[keep],
            region_end=self.region_end[keep],
            region_requested=self.region_requested[keep],
            region_stack=self.stacks_of_regions()[keep],
            region_pool=None if self.region_pool is None else self.region_pool[keep],
        )

    def stacks_of_regions(self) -> np.ndarray:
        if self.region_stack is None or len(self.region_stack) != len(self.region_start):
            return np.full(len(self.region_start), -1, dtype=I64)
        return self.region_stack


@dataclass(frozen=True)
class CgroupSeries:
    effective_cores: float | None
    source: str | None
    period_us: int | None
    version: str
    t_ns: np.ndarray
    nr_periods: np.ndarray
    nr_throttled: np.ndarray
    throttled_ns: np.ndarray
    usage_ns: np.ndarray
    pressure_some_us: np.ndarray


@dataclass(frozen=True)
class Bundle:
    directory: Path
    manifest: Manifest
    proc: ProcSeries | None
    pyspy: PythonSamples | None
    perf: PerfSamples | None
    sched: EbpfData | None
    cgroup: CgroupSeries | None

    @property
    def window(self) -> tuple[int, int]:
        window = self.manifest.window
        return (window.start_ns, window.end_ns) if window else (0, 0)

    def missing(self) -> dict[str, str]:
        """Collectors that gave nothing, with the reason the manifest records."""
        out = {}
        for name, result in self.manifest.collectors.items():
            if result.status not in ("ok", "partial"):
                out[name] = f"{result.status}: {result.reason or ''}".strip(": ")
        if self.sched is not None and not self.sched.scheduler_traced:
            ebpf = self.manifest.collectors.get(OWNER[EBPF])
            reason = self.sched.scheduler_skipped or (ebpf.reason if ebpf else "")
            out["ebpf scheduler tracepoints"] = reason or "not traced"
        if self.sched is not None and self.sched.regions_skipped:
            out["ebpf OpenMP region probes"] = self.sched.regions_skipped
        # auto chose bcc only where the prebuilt program could not load or failed.
        if self.sched is not None and self.sched.loader == "bcc":
            reason = self.sched.loader_reason
            if reason.startswith("auto: "):
                out["ebpf prebuilt CO-RE program"] = f"{reason[6:]}; bcc ran instead"
        return out


def _collector_notes(manifest: Fields, part: str) -> Fields:
    collectors = manifest.table("collectors", optional=True)
    return collectors.table(OWNER[part], optional=True).table("notes", optional=True)


def _fill(table: Fields, key: str, fill: int, count: int) -> np.ndarray:
    """A column older bundles lack (absent, null or empty): `fill` in every row."""
    if not table.data.get(key):
        return np.full(count, fill, dtype=I64)
    column = table.column(key)
    if len(column) != count:
        raise BadBundle(f"{table.label(key)} has {len(column)} rows, not {count}")
    return column


def _proc(files: BundleFiles) -> ProcSeries | None:
    data = files.part(PROC)
    if data is None:
        return None
    samples = data.columns("samples", {"t_ns": 0, "tid": 0, "utime": 0, "stime": 0})
    process = data.columns("process", {"t_ns": 0, "utime": 0, "stime": 0})
    names = data.by_tid("threads")
    return ProcSeries(
        clock_ticks=data.integer("clock_ticks", minimum=1),
        names={tid: need_text(name, data.label(f"threads.{tid}")) for tid, name in names.items()},
        t_ns=samples["t_ns"],
        tid=samples["tid"],
        cpu_ticks=samples["utime"] + samples["stime"],
        process_t_ns=process["t_ns"],
        process_ticks=process["utime"] + process["stime"],
        # Bundles from before the split sampler read every thread at every sample.
        full_t_ns=np.unique(
            data.column("full_t_ns") if "full_t_ns" in data.data else samples["t_ns"]
        ),
    )


def _frames(data: Fields, width: int) -> list[list[object]]:
    """The frame table: each frame a list of `width` values (checked by the caller)."""
    frames: list[list[object]] = []
    for i, frame in enumerate(data.items("frames")):
        if not isinstance(frame, list) or len(frame) < width:
            raise BadBundle(f"{data.label(f'frames[{i}]')} is {describe(frame)}, not a frame")
        frames.append(frame)
    return frames


def _stacks(data: Fields, frames: int) -> tuple[tuple[int, ...], ...]:
    return tuple(
        need_ids(stack, data.label(f"stacks[{i}]"), frames)
        for i, stack in enumerate(data.items("stacks"))
    )


def _pyspy(files: BundleFiles, manifest: Fields) -> PythonSamples | None:
    data = files.part(PYSPY)
    if data is None:
        return None
    frames = tuple(
        Frame(
            file=need_text(f[1], data.label(f"frames[{i}][1]")),
            function=need_text(f[0], data.label(f"frames[{i}][0]")),
            line=need_int(f[2], data.label(f"frames[{i}][2]"), minimum=None),
        )
        for i, f in enumerate(_frames(data, 3))
    )
    stacks = _stacks(data, len(frames))
    spans = data.table("spans")
    columns = data.columns("spans", {"tid": 0, "start_ns": 0, "end_ns": 0, "stack": 0})
    count = len(columns["tid"])
    rate = _collector_notes(manifest, PYSPY).maybe_number("rate_hz") or manifest.table(
        "options", optional=True
    ).number("rate_hz", 20)
    span_rate = _fill(spans, "rate_hz", int(rate), count)
    _within_samples(columns["start_ns"], columns["end_ns"], span_rate, int(rate), spans.label(""))
    return PythonSamples(
        frames=frames,
        stacks=stacks,
        names={
            tid: need_text(name, data.label(f"threads.{tid}"))
            for tid, name in data.by_tid("threads", optional=True).items()
        },
        tid=columns["tid"],
        start_ns=columns["start_ns"],
        end_ns=columns["end_ns"],
        stack=need_below(columns["stack"], len(stacks), spans.label("stack"), "stacks"),
        rate_hz=int(rate),
        sources={
            key: need_text(code, data.label(f"sources.{key}"))
            for key, code in data.table("sources", optional=True).data.items()
        },
        span_rate_hz=span_rate,
        span_native=_fill(spans, "native", 1, count),
    )


def _within_samples(
    start: np.ndarray, end: np.ndarray, span_rate: np.ndarray, rate: int, label: str
) -> None:
    """Analysis expands each span into the samples it stands for (attribution.expand_weighted):
    a span of a year, or a rate of 10^15 Hz, would ask for petabytes."""
    rates = np.maximum(1, np.where(span_rate > 0, span_rate, rate)).astype(float)
    samples = np.maximum(1, np.rint((end - start) * rates / 1e9)).sum()
    if samples > MAX_SPAN_SAMPLES:
        raise BadBundle(
            f"{label.rstrip('.')} stand for {samples:.3g} samples, more than the "
            f"{MAX_SPAN_SAMPLES:.3g} a capture takes"
        )


def _py_frames(stack: Fields) -> tuple[Frame, ...]:
    return tuple(
        Frame(
            frame.text("file"),
            frame.text("function"),
            frame.integer("line", minimum=None),
            frame.maybe_text("code"),
            python=True,
        )
        for frame in stack.objects("frames")
    )


def _py_stacks(python: Fields | None) -> tuple[PyStack, ...]:
    """The Python stacks the eBPF walker read, which regions and samples index."""
    if python is None:
        return ()
    return tuple(
        PyStack(
            frames=(TRUNCATED_ROOT, *_py_frames(stack))
            if stack.flag("truncated")
            else _py_frames(stack),
            regions=stack.integer("regions", 0),
            region_ns=stack.integer("region_ns", 0),
            truncated=stack.flag("truncated"),
        )
        for stack in python.objects("stacks", optional=True)
    )


def python_samples_from_ebpf(files: BundleFiles, manifest: Fields) -> PythonSamples | None:
    """The eBPF walker's on-CPU samples of the Python threads, in py-spy's shape: one span per
    sample, Python frames only (no native frames, as py-spy --nonblocking)."""
    data = files.part(EBPF)
    python = data.maybe_table("python") if data is not None else None
    samples = python.maybe_table("samples") if python is not None else None
    if python is None or samples is None or not samples.data.get("t_ns"):
        return None
    thread_names = {
        t.integer("tid"): t.text("name")
        for t in manifest.table("target", optional=True).objects("threads", optional=True)
    }
    frames: dict[tuple[str, str, int], int] = {}
    sources: dict[str, str] = {}
    stacks: list[tuple[int, ...]] = []
    for py_stack in _py_stacks(python):
        ids = []
        for f in py_stack.frames:
            ids.append(frames.setdefault((f.function, f.file, f.line), len(frames)))
            if f.code:
                sources[f"{f.file}:{f.line}"] = f.code
        stacks.append(tuple(ids))
    # A sample whose walk found no Python frame keeps an empty stack.
    empty = len(stacks)
    stacks.append(())
    columns = python.columns("samples", {"t_ns": 0, "tid": 0, "stack": -1})
    stack = need_below(columns["stack"], empty, samples.label("stack"), "python.stacks")
    t_ns = columns["t_ns"]
    rate = int(samples.number("rate_hz", 49))
    return PythonSamples(
        frames=tuple(
            Frame(file=f, function=name, line=line, python=True) for name, f, line in frames
        ),
        stacks=tuple(stacks),
        names={
            tid: thread_names.get(tid, "python")
            for tid in (
                need_int(t, python.label(f"threads[{i}]"))
                for i, t in enumerate(python.items("threads", optional=True))
            )
        },
        tid=columns["tid"],
        start_ns=t_ns,
        end_ns=t_ns,
        stack=np.where(stack >= 0, stack, empty),
        rate_hz=rate,
        sources=sources,
        span_rate_hz=np.full(len(t_ns), rate, dtype=I64),
        span_native=np.zeros(len(t_ns), dtype=I64),
        source="ebpf",
    )


def _perf(files: BundleFiles, manifest: Fields) -> PerfSamples | None:
    """perf record's samples, or where it was not in the capture the eBPF sampler's native
    stacks, which native.json holds in the same tables."""
    name = PERF
    data = files.part(PERF)
    if data is None:
        name, data = NATIVE, files.part(NATIVE)
    if data is None:
        return None
    frames = tuple(
        (
            need_text(f[0], data.label(f"frames[{i}][0]")),
            need_text(f[1], data.label(f"frames[{i}][1]")),
        )
        for i, f in enumerate(_frames(data, 2))
    )
    stacks = _stacks(data, len(frames))
    samples = data.columns("samples", {"t_ns": 0, "tid": 0, "period_ns": 0, "stack": 0})
    label = data.table("samples").label("stack")
    return PerfSamples(
        frames=frames,
        stacks=stacks,
        t_ns=samples["t_ns"],
        tid=samples["tid"],
        period_ns=samples["period_ns"],
        stack=need_below(samples["stack"], len(stacks), label, "stacks"),
        callgraph=_collector_notes(manifest, name).text("callgraph", "fp"),
        source="perf record" if name == PERF else "eBPF",
    )


def _sched(files: BundleFiles, manifest: Fields) -> EbpfData | None:
    data = files.part(EBPF)
    if data is None:
        return None
    slices = data.columns("slices", {"start_ns": 0, "end_ns": 0, "tid": 0, "voluntary": 0})
    table = data.table("regions")
    regions = data.columns("regions", {"start_ns": 0, "end_ns": 0, "tid": 0, "requested": 0})
    python = data.maybe_table("python")
    stacks = _py_stacks(python)
    region_stack = None
    if "stack" in table.data:
        region_stack = need_below(
            table.column("stack", minimum=-1), len(stacks), table.label("stack"), "python.stacks"
        )
        # A region's site is the innermost frame of its stack.
        if any(not stacks[i].frames for i in set(region_stack.tolist()) if i >= 0):
            raise BadBundle(f"{table.label('stack')} names a Python stack without frames")
    attached = data.texts("attached", optional=True)
    lost = data.table("lost", optional=True)
    decision = data.maybe_table("regions_decision") or Fields({}, data.where, "regions_decision.")
    sched = data.maybe_table("sched") or Fields({}, data.where, "sched.")
    loader = data.maybe_table("loader") or Fields({}, data.where, "loader.")
    primary = manifest.table("target", optional=True).maybe_text("openmp_runtime")
    return EbpfData(
        loader=loader.text("name", ""),
        loader_version=loader.text("version", ""),
        loader_reason=loader.text("reason", ""),
        threads={
            tid: _thread_times(data, tid, times) for tid, times in data.by_tid("threads").items()
        },
        wakeups=tuple(
            (w[0], w[1], w[2])
            for w in (
                _ints(wakeup, data.label(f"wakeups[{i}]"), 3)
                for i, wakeup in enumerate(data.items("wakeups"))
            )
        ),
        slice_tid=slices["tid"],
        slice_start=slices["start_ns"],
        slice_end=slices["end_ns"],
        slice_voluntary=slices["voluntary"],
        region_tid=regions["tid"],
        region_start=regions["start_ns"],
        region_end=regions["end_ns"],
        region_requested=regions["requested"],
        lost=sum(need_int(count, lost.label(key)) for key, count in lost.data.items()),
        uprobes_attached=any(a.startswith("uprobe:") for a in attached),
        # bcc's classic tracepoint or the CO-RE program's BTF one
        scheduler_traced=any("sched:sched_switch" in a for a in attached),
        scheduler_skipped=sched.text("reason", ""),
        # Only where they came off for good: switched probes' reason is not a missing part.
        regions_skipped=decision.text("reason", "") if not decision.flag("traced", True) else "",
        region_on=tuple(
            (on[0], on[1])
            for on in (
                _ints(pair, decision.label(f"on_ns[{i}]"), 2)
                for i, pair in enumerate(decision.items("on_ns", optional=True))
            )
        ),
        region_stack=region_stack,
        **_python_fields(python, stacks),
        **_region_pools(data, len(regions["tid"]), primary),
    )


def _ints(value: object, label: str, count: int) -> list[int]:
    """A fixed-length list of counts or times: a wakeup [waker, wakee, count], an on-time."""
    if not isinstance(value, list) or len(value) != count:
        raise BadBundle(f"{label} is {describe(value)}, not a list of {count} integers")
    return [need_int(v, label) for v in value]


def _thread_times(data: Fields, tid: int, times: object) -> dict[str, int]:
    """A thread's counts from the scheduler tracepoints: oncpu_ns, offcpu_ns, voluntary..."""
    label = data.label(f"threads.{tid}")
    if not isinstance(times, dict):
        raise BadBundle(f"{label} is {describe(times)}, not an object")
    if "offcpu_ns" not in times:
        raise BadBundle(f"{label} lacks offcpu_ns")
    return {key: need_int(value, f"{label}.{key}") for key, value in times.items()}


def pool_names(runtimes: tuple[dict, ...], primary: str | None) -> list[str]:
    """One pool name per runtime copy, in index order. A process may map several copies of one
    runtime (a package bundling its own libgomp beside torch's), each with its own workers: the
    copy the target's pool size is read from (`primary`), else the first, is named by its kind
    ("openmp"), every other copy by its kind and file name ("openmp@libgomp-a1b2.so.1")."""
    names: list[str] = []
    kinds = [str(r.get("pool", "openmp")) for r in runtimes]
    first: dict[str, int] = {}
    for index, (kind, runtime) in enumerate(zip(kinds, runtimes, strict=True)):
        if runtime.get("path") == primary:
            first.setdefault(kind, index)
    for index, kind in enumerate(kinds):
        first.setdefault(kind, index)
    for index, (kind, runtime) in enumerate(zip(kinds, runtimes, strict=True)):
        if first[kind] == index:
            names.append(kind)
            continue
        name = f"{kind}@{Path(str(runtime.get('path', index))).name}"
        names.append(name if name not in names else f"{name}#{index}")
    return names


class _PoolFields(TypedDict):
    runtimes: tuple[dict, ...]
    pool_names: tuple[str, ...]
    region_pool: np.ndarray | None


class _PythonFields(TypedDict):
    python_stacks: tuple[PyStack, ...]
    python_offcpu: tuple[tuple[int, int, float], ...]
    walker: str
    walker_reason: str
    python_interpreter: str
    dispatched: DispatchedSamples | None


def _region_pools(data: Fields, count: int, primary: str | None) -> _PoolFields:
    """Bundles from before several runtime copies were probed have one OpenMP runtime."""
    runtimes = tuple(data.objects("runtimes") if data.has("runtimes") else ())
    for runtime in runtimes:
        runtime.maybe_text("pool")
        runtime.maybe_text("path")
    kept = tuple(runtime.data for runtime in runtimes)
    regions = data.table("regions")
    if regions.data.get("runtime") is None:
        return {"runtimes": kept, "pool_names": (), "region_pool": None}
    column = regions.column("runtime", minimum=None)
    if len(column) != count:
        return {"runtimes": kept, "pool_names": (), "region_pool": None}
    pools = pool_names(kept, primary)
    return {
        "runtimes": kept,
        "pool_names": tuple(pools),
        "region_pool": np.array(
            [pools[i] if 0 <= i < len(pools) else "openmp" for i in column.tolist()], dtype=object
        ),
    }


def _python_fields(python: Fields | None, stacks: tuple[PyStack, ...]) -> _PythonFields:
    if python is None:
        return {
            "python_stacks": (),
            "python_offcpu": (),
            "walker": "off",
            "walker_reason": "",
            "python_interpreter": "",
            "dispatched": None,
        }
    offcpu = python.columns("offcpu", {"tid": 0, "stack": None, "ns": 0}, optional=True)
    return {
        "python_stacks": stacks,
        "python_offcpu": tuple(
            (t, i, ns / 1e9)
            for t, i, ns in zip(
                offcpu["tid"].tolist(), offcpu["stack"].tolist(), offcpu["ns"].tolist(), strict=True
            )
            if 0 <= i < len(stacks)
        ),
        "walker": python.text("walker", "off"),
        "walker_reason": python.text("reason", ""),
        "python_interpreter": _interpreter(python),
        "dispatched": _dispatched(python, len(stacks)),
    }


def _interpreter(python: Fields) -> str:
    version = python.text("full_version", "") or python.text("version", "")
    if not version:
        return ""
    parts = [f"Python {version}"]
    if python.text("build", ""):
        parts.append(python.text("build", ""))
    if python.text("layout", ""):
        parts.append(f"layout from {python.text('layout', '')}")
    return ", ".join(parts)


def _dispatched(python: Fields, stacks: int) -> DispatchedSamples | None:
    """Bundles from before the sampler read a worker's dispatcher have none."""
    table = python.maybe_table("dispatched")
    if table is None:
        return None
    columns = python.columns(
        "dispatched", {"t_ns": 0, "tid": 0, "dispatcher": 0, "how": 0, "stack": -1}
    )
    label = table.label("how")
    if not set(columns["how"].tolist()) <= set(DISPATCH_HOW):
        raise BadBundle(f"{label} holds a value other than {sorted(DISPATCH_HOW)}")
    return DispatchedSamples(
        t_ns=columns["t_ns"],
        tid=columns["tid"],
        dispatcher=columns["dispatcher"],
        how=columns["how"],
        stack=need_below(columns["stack"], stacks, table.label("stack"), "python.stacks"),
        rate_hz=table.integer("rate_hz", minimum=1),
    )


def _cgroup(files: BundleFiles) -> CgroupSeries | None:
    data = files.part(CGROUP)
    if data is None:
        return None
    # -1: not available (cgroup v1 has no pressure, a counter may be missing).
    s = data.columns(
        "samples",
        {
            "t_ns": 0,
            "nr_periods": -1,
            "nr_throttled": -1,
            "throttled_ns": -1,
            "usage_ns": -1,
            "pressure_some_us": -1,
        },
    )
    return CgroupSeries(
        effective_cores=data.maybe_number("effective_cores", MIN_CORES),
        source=data.maybe_text("source"),
        period_us=data.maybe_integer("period_us"),
        version=data.text("version", ""),
        t_ns=s["t_ns"],
        nr_periods=s["nr_periods"],
        nr_throttled=s["nr_throttled"],
        throttled_ns=s["throttled_ns"],
        usage_ns=s["usage_ns"],
        pressure_some_us=s["pressure_some_us"],
    )


def load_bundle(directory: Path | str) -> Bundle:
    """Every part read through load.BundleFiles, each value checked as it is taken: a bundle
    someone else made gives a Bundle, or one line (BadBundle; PermissionDenied for a part this
    user may not read), nothing else."""
    directory = Path(directory)
    with BundleFiles(directory) as files:
        manifest = files.manifest()
        return Bundle(
            directory,
            Manifest.read(manifest),
            _proc(files),
            _pyspy(files, manifest) or python_samples_from_ebpf(files, manifest),
            _perf(files, manifest),
            _sched(files, manifest),
            _cgroup(files),
        )
