"""Typed, frozen views of a session bundle, loaded once; every analysis step reads these."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict

import numpy as np

from ..errors import BadBundle
from .parts import CGROUP, EBPF, NATIVE, OWNER, PERF, PROC, PYSPY
from .write import load_manifest, load_part

I64 = np.int64


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


@dataclass(frozen=True)
class Frame:
    name: str
    file: str  # a .py path for Python frames, the DSO path for native ones
    line: int

    @property
    def is_python(self) -> bool:
        return self.file.endswith(".py")


@dataclass(frozen=True)
class PySpySpans:
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
    source: str = "py-spy"  # or "ebpf": the walker's on-CPU samples, one span per sample


@dataclass(frozen=True)
class PerfSamples:
    frames: tuple[tuple[str, str], ...]  # (symbol, dso)
    stacks: tuple[tuple[int, ...], ...]  # root first
    t_ns: np.ndarray
    tid: np.ndarray
    period_ns: np.ndarray
    stack: np.ndarray
    callgraph: str
    source: str = "perf record"  # or "eBPF": the walker's sampler, where perf record did not run


@dataclass(frozen=True)
class PyFrame:
    file: str
    function: str
    line: int
    code: str | None = None  # the source line, read from the target's file at capture


@dataclass(frozen=True)
class PyStack:
    """A Python stack the eBPF walker read at region entries, outermost frame first."""

    frames: tuple[PyFrame, ...]
    regions: int
    region_ns: int
    truncated: bool = False


@dataclass(frozen=True)
class SchedData:
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
    regions_skipped: str = ""  # why the region probes were detached, when they were
    # When the region probes were switched on and off to fit the budget: their on-times (ns).
    # Empty when they stayed on (or off) for the whole capture.
    region_on: tuple[tuple[int, int], ...] = ()
    # Each region's index into python_stacks, -1 where the walker read none.
    region_stack: np.ndarray | None = None
    python_stacks: tuple[PyStack, ...] = ()
    walker: str = "off"  # "on" when the eBPF stack walker ran
    walker_reason: str = ""
    # The pool of the runtime copy that started each region ("openmp", "openblas"; pool_names).
    region_pool: np.ndarray | None = None
    runtimes: tuple[dict, ...] = ()  # every runtime copy probed, by index
    pool_names: tuple[str, ...] = ()  # the pool each runtime copy feeds, by index (pool_names())
    # Python threads' time off CPU by the stack they left with: (tid, stack index, seconds).
    python_offcpu: tuple[tuple[int, int, float], ...] = ()

    def for_pool(self, pool: str) -> SchedData:
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
    manifest: dict
    proc: ProcSeries | None
    pyspy: PySpySpans | None
    perf: PerfSamples | None
    sched: SchedData | None
    cgroup: CgroupSeries | None

    @property
    def window(self) -> tuple[int, int]:
        window = self.manifest.get("window") or {}
        return int(window.get("start_ns", 0)), int(window.get("end_ns", 0))

    def missing(self) -> dict[str, str]:
        """Collectors that gave nothing, with the reason the manifest records."""
        out = {}
        for name, result in self.manifest.get("collectors", {}).items():
            if result.get("status") not in ("ok", "partial"):
                out[name] = f"{result.get('status')}: {result.get('reason', '')}".strip(": ")
        if self.sched is not None and not self.sched.scheduler_traced:
            reason = self.manifest.get("collectors", {}).get(OWNER[EBPF], {}).get("reason", "")
            out["ebpf scheduler tracepoints"] = reason or "not traced"
        if self.sched is not None and self.sched.regions_skipped:
            out["ebpf OpenMP region probes"] = self.sched.regions_skipped
        return out


def _array(values: list, name: str, path: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=I64)
    except (TypeError, ValueError) as exc:
        raise BadBundle(f"{path}: column {name} is not numeric") from exc


def _proc(directory: Path) -> ProcSeries | None:
    data = load_part(directory, PROC)
    if data is None:
        return None
    try:
        samples, process = data["samples"], data["process"]
        t_ns = _array(samples["t_ns"], "t_ns", PROC)
        return ProcSeries(
            clock_ticks=int(data["clock_ticks"]),
            names={int(k): v for k, v in data["threads"].items()},
            t_ns=t_ns,
            tid=_array(samples["tid"], "tid", PROC),
            cpu_ticks=_array(samples["utime"], "utime", PROC)
            + _array(samples["stime"], "stime", PROC),
            process_t_ns=_array(process["t_ns"], "t_ns", PROC),
            process_ticks=_array(process["utime"], "utime", PROC)
            + _array(process["stime"], "stime", PROC),
            # Bundles from before the split sampler read every thread at every sample.
            full_t_ns=np.unique(
                _array(data["full_t_ns"], "full_t_ns", PROC) if "full_t_ns" in data else t_ns
            ),
        )
    except (KeyError, TypeError) as exc:
        raise BadBundle(f"{PROC} lacks {exc}") from exc


def _pyspy(directory: Path, manifest: dict) -> PySpySpans | None:
    data = load_part(directory, PYSPY)
    if data is None:
        return None
    try:
        spans = data["spans"]
        rate = manifest["collectors"].get(OWNER[PYSPY], {}).get("notes", {}).get(
            "rate_hz"
        ) or manifest.get("options", {}).get("rate_hz", 20)
        return PySpySpans(
            frames=tuple(Frame(str(f[0]), str(f[1]), int(f[2])) for f in data["frames"]),
            stacks=tuple(tuple(s) for s in data["stacks"]),
            names={int(k): v for k, v in data.get("threads", {}).items()},
            tid=_array(spans["tid"], "tid", PYSPY),
            start_ns=_array(spans["start_ns"], "start_ns", PYSPY),
            end_ns=_array(spans["end_ns"], "end_ns", PYSPY),
            stack=_array(spans["stack"], "stack", PYSPY),
            rate_hz=int(rate),
            sources=dict(data.get("sources", {})),
            span_rate_hz=_array(
                spans.get("rate_hz") or [int(rate)] * len(spans["tid"]), "rate_hz", PYSPY
            ),
            span_native=_array(spans.get("native") or [1] * len(spans["tid"]), "native", PYSPY),
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise BadBundle(f"{PYSPY} lacks {exc}") from exc


def python_samples_from_ebpf(directory: Path, manifest: dict) -> PySpySpans | None:
    """The eBPF walker's on-CPU samples of the Python threads, in py-spy's shape: one span per
    sample, Python frames only (no native frames, as py-spy --nonblocking)."""
    data = load_part(directory, EBPF)
    python = (data or {}).get("python") or {}
    samples = python.get("samples")
    if not samples or not samples.get("t_ns"):
        return None
    thread_names = {
        int(t["tid"]): str(t["name"]) for t in manifest.get("target", {}).get("threads", [])
    }
    try:
        frames: dict[tuple[str, str, int], int] = {}
        sources: dict[str, str] = {}
        stacks: list[tuple[int, ...]] = []
        for stack in python["stacks"]:
            ids = []
            for f in stack["frames"]:
                key = (str(f["function"]), str(f["file"]), int(f["line"]))
                ids.append(frames.setdefault(key, len(frames)))
                if f.get("code"):
                    sources[f"{f['file']}:{f['line']}"] = str(f["code"])
            stacks.append(tuple(ids))
        # A sample whose walk found no Python frame keeps an empty stack.
        empty = len(stacks)
        stacks.append(())
        stack = np.asarray(samples["stack"], dtype=I64)
        stack = np.where(stack >= 0, stack, empty)
        t_ns = _array(samples["t_ns"], "t_ns", EBPF)
        rate = int(samples.get("rate_hz", 49))
        return PySpySpans(
            frames=tuple(Frame(*key) for key in frames),
            stacks=tuple(stacks),
            names={int(t): thread_names.get(int(t), "python") for t in python.get("threads", [])},
            tid=_array(samples["tid"], "tid", EBPF),
            start_ns=t_ns,
            end_ns=t_ns,
            stack=stack,
            rate_hz=rate,
            sources=sources,
            span_rate_hz=np.full(len(t_ns), rate, dtype=I64),
            span_native=np.zeros(len(t_ns), dtype=I64),
            source="ebpf",
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadBundle(f"{EBPF}'s Python samples lack {exc}") from exc


def _perf(directory: Path, manifest: dict) -> PerfSamples | None:
    """perf record's samples, or where it was not in the capture the eBPF sampler's native
    stacks, which native.json holds in the same tables."""
    name = PERF
    data = load_part(directory, PERF)
    if data is None:
        name, data = NATIVE, load_part(directory, NATIVE)
    if data is None:
        return None
    try:
        samples = data["samples"]
        notes = manifest["collectors"].get(OWNER[name], {}).get("notes", {})
        return PerfSamples(
            frames=tuple((str(f[0]), str(f[1])) for f in data["frames"]),
            stacks=tuple(tuple(s) for s in data["stacks"]),
            t_ns=_array(samples["t_ns"], "t_ns", name),
            tid=_array(samples["tid"], "tid", name),
            period_ns=_array(samples["period_ns"], "period_ns", name),
            stack=_array(samples["stack"], "stack", name),
            callgraph=str(notes.get("callgraph", "fp")),
            source="perf record" if name == PERF else "eBPF",
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise BadBundle(f"{name} lacks {exc}") from exc


def _sched(directory: Path, manifest: dict) -> SchedData | None:
    data = load_part(directory, EBPF)
    if data is None:
        return None
    try:
        slices, regions = data["slices"], data["regions"]
        attached = data.get("attached", [])
        return SchedData(
            threads={int(k): v for k, v in data["threads"].items()},
            wakeups=tuple((int(a), int(b), int(c)) for a, b, c in data["wakeups"]),
            slice_tid=_array(slices["tid"], "tid", EBPF),
            slice_start=_array(slices["start_ns"], "start_ns", EBPF),
            slice_end=_array(slices["end_ns"], "end_ns", EBPF),
            slice_voluntary=_array(slices["voluntary"], "voluntary", EBPF),
            region_tid=_array(regions["tid"], "tid", EBPF),
            region_start=_array(regions["start_ns"], "start_ns", EBPF),
            region_end=_array(regions["end_ns"], "end_ns", EBPF),
            region_requested=_array(regions["requested"], "requested", EBPF),
            lost=int(sum(data.get("lost", {}).values())),
            uprobes_attached=any(a.startswith("uprobe:") for a in attached),
            scheduler_traced=any(a.startswith("tracepoint:sched") for a in attached),
            regions_skipped=str((data.get("regions_decision") or {}).get("reason", "")),
            region_on=tuple(
                (int(a), int(b)) for a, b in (data.get("regions_decision") or {}).get("on_ns", [])
            ),
            region_stack=(_array(regions["stack"], "stack", EBPF) if "stack" in regions else None),
            **_python_stacks(data.get("python") or {}),
            **_region_pools(
                data, len(regions["tid"]), manifest.get("target", {}).get("openmp_runtime")
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadBundle(f"{EBPF} lacks {exc}") from exc


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


def _region_pools(data: dict, count: int, primary: str | None) -> _PoolFields:
    """Bundles from before several runtime copies were probed have one OpenMP runtime."""
    runtimes = tuple(data.get("runtimes") or ())
    column = data["regions"].get("runtime")
    if column is None or len(column) != count:
        return {"runtimes": runtimes, "pool_names": (), "region_pool": None}
    pools = pool_names(runtimes, primary)
    return {
        "runtimes": runtimes,
        "pool_names": tuple(pools),
        "region_pool": np.array(
            [pools[i] if 0 <= i < len(pools) else "openmp" for i in column], dtype=object
        ),
    }


def _python_stacks(python: dict) -> _PythonFields:
    stacks = tuple(
        PyStack(
            frames=tuple(
                PyFrame(str(f["file"]), str(f["function"]), int(f["line"]), f.get("code"))
                for f in stack["frames"]
            ),
            regions=int(stack.get("regions", 0)),
            region_ns=int(stack.get("region_ns", 0)),
            truncated=bool(stack.get("truncated", False)),
        )
        for stack in python.get("stacks", [])
    )
    offcpu = python.get("offcpu") or {}
    return {
        "python_stacks": stacks,
        "python_offcpu": tuple(
            (int(t), int(i), int(ns) / 1e9)
            for t, i, ns in zip(
                offcpu.get("tid", []), offcpu.get("stack", []), offcpu.get("ns", []), strict=True
            )
            if 0 <= int(i) < len(stacks)
        ),
        "walker": str(python.get("walker", "off")),
        "walker_reason": str(python.get("reason", "")),
    }


def _cgroup(directory: Path) -> CgroupSeries | None:
    data = load_part(directory, CGROUP)
    if data is None:
        return None
    try:
        s = data["samples"]
        return CgroupSeries(
            effective_cores=data.get("effective_cores"),
            source=data.get("source"),
            period_us=data.get("period_us"),
            version=str(data.get("version", "")),
            t_ns=_array(s["t_ns"], "t_ns", CGROUP),
            nr_periods=_array(s["nr_periods"], "nr_periods", CGROUP),
            nr_throttled=_array(s["nr_throttled"], "nr_throttled", CGROUP),
            throttled_ns=_array(s["throttled_ns"], "throttled_ns", CGROUP),
            usage_ns=_array(s["usage_ns"], "usage_ns", CGROUP),
            pressure_some_us=_array(s["pressure_some_us"], "pressure_some_us", CGROUP),
        )
    except (KeyError, TypeError) as exc:
        raise BadBundle(f"{CGROUP} lacks {exc}") from exc


def load_bundle(directory: Path | str) -> Bundle:
    directory = Path(directory)
    manifest = load_manifest(directory)
    return Bundle(
        directory,
        manifest,
        _proc(directory),
        _pyspy(directory, manifest) or python_samples_from_ebpf(directory, manifest),
        _perf(directory, manifest),
        _sched(directory, manifest),
        _cgroup(directory),
    )
