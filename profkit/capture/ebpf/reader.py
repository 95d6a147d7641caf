"""What the window's programs hold, read once the window has closed: the tables ebpf.json and
native.json are written from, whichever loader loaded the programs (their maps are read by
name, bcc's tables and the CO-RE loader's alike). The collector decides what was attached and
when; this module only reads."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from ...host.target import Target
from .loaders import Program
from .logs import read_regions, read_samples, read_sched, region_columns, slice_columns
from .native import native_tables, read_stacks
from .pywalk import PythonWalker


@dataclass(frozen=True)
class ReadPlan:
    """What the capture did, which says what there is to read."""

    target: Target
    end_ns: int
    counts: tuple[int, int, int] | None  # unseen_ends() while every probe was on
    regions_detached: bool
    on_ns: tuple[tuple[int, int], ...]  # the switched probes' on-times
    sampling: bool  # the on-CPU sampler ran
    native: bool  # and took native stacks
    sample_hz: int
    name_frames: bool  # name native frames from the files' symbol tables (no bcc cache)
    sched: bool  # the scheduler's tracepoints were on


@dataclass
class EbpfTables:
    """Everything read, in the shapes the bundle's parts hold."""

    threads: dict[str, Any] = field(default_factory=dict)
    wakeups: list[list[int]] = field(default_factory=list)
    slices: dict[str, list[int]] = field(default_factory=slice_columns)
    regions: dict[str, list[int]] = field(default_factory=region_columns)
    python: dict[str, object] = field(default_factory=dict)
    region_entries: int | None = None
    histogram_us_log2: dict[str, int] = field(default_factory=dict)
    native: dict[str, Any] | None = None  # native.json, where the sampler took native stacks
    regions_before_on_times: int = 0
    regions_after_on_times: int = 0
    warnings: list[str] = field(default_factory=list)


def read_tables(
    process: Program | None,
    walker: PythonWalker | None,
    plan: ReadPlan,
    lost: dict[str, int],
) -> EbpfTables:
    """The process program's logs and counters (regions, the walker's stacks, the sampler's
    samples) and the scheduler's; `lost` gains what each log dropped."""
    out = EbpfTables()
    # Off-CPU time per (Python stack, thread), the intervals still open at the window's end
    # closed there, as the threads' on/off-CPU times are.
    offcpu_by_stack: dict[tuple[int, int], list[int]] = {}
    if process is not None and plan.sched:
        tables = read_sched(process, plan.end_ns, lost)
        out.threads, out.wakeups = tables.threads, tables.wakeups
        out.slices, offcpu_by_stack = tables.slices, tables.offcpu_by_stack
    out.python = {"walker": "off", "reason": "no OpenMP region probe"}
    if walker is not None:
        out.python["reason"] = walker.reason
    if process is None:
        return out
    assert plan.counts is not None
    entries, ended, missed = plan.counts
    # Not after the probes were detached: regions in flight then lose their ends, and the log
    # is not read.
    if not plan.regions_detached and missed > max(5, entries // 100):
        out.warnings.append(
            f"{missed} of {entries} OpenMP regions ended where the end probe did not see them: "
            "region times are incomplete"
        )
    stack_index: dict[int, int] = {}
    if walker is not None and walker.layout is not None:
        out.python, stack_index = walker.read()
    if not plan.regions_detached:
        found = read_regions(process, ended, stack_index, list(plan.on_ns), lost)
        out.regions = found.columns
        out.regions_before_on_times = found.before_on_times
        out.regions_after_on_times = found.after_on_times
    if plan.sampling:
        samples = read_samples(process, stack_index, plan.sample_hz)
        out.python["samples"], out.python["dispatched"] = samples.python, samples.dispatched
        lost["python_samples"] = samples.lost
        if plan.native:
            out.native = _native(process, samples.rows, samples.lost, plan)
    if plan.sched and stack_index:
        out.python["offcpu"] = {
            "tid": [tid for (_, tid) in offcpu_by_stack],
            "stack": [stack_index.get(stack, -1) for (stack, _) in offcpu_by_stack],
            "ns": [v[0] for v in offcpu_by_stack.values()],
            "switches": [v[1] for v in offcpu_by_stack.values()],
        }
    out.region_entries = entries
    out.histogram_us_log2 = {
        str(k.value): v.value for k, v in process["duration_us_log2"].items() if v.value
    }
    return out


def _native(process: Program, rows: list, lost: int, plan: ReadPlan) -> dict[str, Any]:
    """Every thread's native stacks, where the sampler took them, as perf.json's tables."""
    pid = plan.target.pid
    # Imported here: it brings numpy, a tenth of a second start-up need not wait for.
    from ...host.symbols import ProcessSymbols

    # Without bcc, its symbol cache is not there either.
    names = ProcessSymbols(pid) if plan.name_frames else None
    try:
        native = native_tables(
            [(int(v.t_ns), int(v.tid), int(v.native)) for _, v in rows],
            read_stacks(process["native_stacks"]),
            pid,
            round(1e9 / plan.sample_hz),
            names,
        )
    finally:
        if names is not None:
            names.close()
    # Samples whose stack did not fit the full map, and those past the log.
    native["lost"] += int(process["native_counts"][ctypes.c_int(0)].value) + lost
    return native
