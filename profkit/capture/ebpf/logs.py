"""Reading the programs' in-kernel logs and counters after the window, whichever loader loaded
them (bcc's tables or the CO-RE loader's, which offer the same access)."""

from __future__ import annotations

import bisect
import ctypes
from dataclasses import dataclass
from typing import Any

from .loaders.bcc import BpfProgram
from .loaders.bpf import Table


def sampled_count(python: dict[str, object]) -> int:
    """The sampler's on-CPU samples, of Python threads and of the others."""
    count = 0
    for part in ("samples", "dispatched"):
        table = python.get(part)
        if isinstance(table, dict):
            count += len(table.get("t_ns") or ())
    return count


def entry_count(bpf: BpfProgram) -> int:
    """Regions entered while an entry probe was on, over every runtime copy."""
    return sum(int(v.value) for _, v in bpf["runtime_entries"].items())


def read_log(
    bpf: BpfProgram, log_name: str, count: int, lost: dict[str, int], which: str
) -> list[tuple[int, Any]]:
    """The first `count` entries of an in-kernel array log, in the order they were written."""
    log = bpf[log_name]
    capacity = len(log)
    used = min(count, capacity)
    lost[which] += max(0, count - capacity)
    if used <= 0 or capacity <= 1:
        return []
    if isinstance(log, Table):  # the CO-RE table's batch lookup reads the used part alone
        return log.first(used)
    # A batch lookup copies the whole array, used or not: for a log mostly empty, one lookup
    # per used entry is cheaper.
    if used < capacity // 8:
        return [(i, log[ctypes.c_int(i)]) for i in range(used)]
    try:
        entries = [(k.value, v) for k, v in log.items_lookup_batch()]
    except Exception:  # kernels without batch lookups: one lookup per entry
        entries = [(i, log[ctypes.c_int(i)]) for i in range(used)]
    return sorted(((index, v) for index, v in entries if index < used), key=lambda e: e[0])


def region_columns() -> dict[str, list[int]]:
    """ebpf.json's regions, empty."""
    return {
        "start_ns": [],
        "end_ns": [],
        "tid": [],
        "requested": [],
        "runtime": [],  # index into the probed runtimes
        "stack": [],  # index into the walker's stacks, -1 for none
    }


def slice_columns() -> dict[str, list[int]]:
    """ebpf.json's slices, empty."""
    return {"start_ns": [], "end_ns": [], "tid": [], "voluntary": []}


@dataclass
class SchedTables:
    """The scheduler program's maps at the window's end."""

    threads: dict[str, dict[str, int]]  # tid -> on/off-CPU time and switches
    wakeups: list[list[int]]  # [waker, wakee, count]
    slices: dict[str, list[int]]
    offcpu_by_stack: dict[tuple[int, int], list[int]]  # (stack, tid) -> [ns, switches]


def read_sched(sched: BpfProgram, end_ns: int, lost: dict[str, int]) -> SchedTables:
    """Each thread's on- and off-CPU time with the interval it is in closed at `end_ns`, the
    wakeups, the slice log, and the off-CPU time per (Python stack, thread)."""
    offcpu_by_stack: dict[tuple[int, int], list[int]] = {}
    threads = {}
    for key, value in sched["times"].items():
        oncpu, offcpu = value.oncpu_ns, value.offcpu_ns
        if value.last_in_ns:
            oncpu += max(0, end_ns - value.last_in_ns)
        elif value.last_out_ns:
            offcpu += max(0, end_ns - value.last_out_ns)
            if value.off_stack:
                open_off = offcpu_by_stack.setdefault((value.off_stack, key.value), [0, 0])
                open_off[0] += max(0, end_ns - value.last_out_ns)
        threads[str(key.value)] = {
            "oncpu_ns": oncpu,
            "offcpu_ns": offcpu,
            "voluntary": value.voluntary,
            "involuntary": value.involuntary,
        }
    slices = slice_columns()
    count = sched["slice_count"][ctypes.c_int(0)].value
    for _, v in read_log(sched, "slice_log", count, lost, "slices"):
        slices["start_ns"].append(v.start_ns)
        slices["end_ns"].append(v.end_ns)
        slices["tid"].append(v.tid)
        slices["voluntary"].append(v.voluntary)
    for k, v in sched["pystack_offcpu"].items():
        off = offcpu_by_stack.setdefault((k.stack, k.tid), [0, 0])
        off[0] += int(v.ns)
        off[1] += int(v.switches)
    wakeups = [[k.waker, k.wakee, v.value] for k, v in sched["wakeups"].items()]
    return SchedTables(threads, wakeups, slices, offcpu_by_stack)


def unseen_ends(bpf: BpfProgram) -> tuple[int, int, int]:
    """(regions entered, regions ended, ends the end probe did not see) so far: one snapshot
    of both counters, so that the log can be read up to it while the target goes on."""
    entries = entry_count(bpf)
    ended = int(bpf["region_count"][ctypes.c_int(0)].value)
    # A thread's entry stays in the map between its regions, marked closed (start_ns 0).
    still_open = sum(1 for _, v in bpf["open_regions"].items() if v.start_ns)
    return entries, ended, entries - ended - still_open


@dataclass
class RegionTables:
    columns: dict[str, list[int]]
    before_on_times: int  # the rate check's regions, before the first on-time, left out
    after_on_times: int  # entered as an on-time's entry probes went off, left out


def read_regions(
    bpf: BpfProgram,
    count: int,
    stack_index: dict[int, int],
    on_ns: list[tuple[int, int]],
    lost: dict[str, int],
) -> RegionTables:
    """The in-kernel region log in one batch, after the window. Where the probes were switched
    (`on_ns`, their on-times), a region entered before the first on-time or after its on-time
    closed (some entry probes still trapping as they went off) is left out: the regions kept
    are those of the on-times."""
    on = sorted(on_ns)
    opens = [a for a, _ in on]
    out = RegionTables(region_columns(), 0, 0)
    for _, v in read_log(bpf, "region_log", count, lost, "regions"):
        if on:
            at = bisect.bisect_right(opens, v.start_ns) - 1
            if at < 0:
                out.before_on_times += 1
                continue
            if v.start_ns > on[at][1]:
                out.after_on_times += 1
                continue
        for key in ("start_ns", "end_ns", "tid", "requested", "runtime"):
            out.columns[key].append(getattr(v, key))
        out.columns["stack"].append(stack_index.get(int(v.stack), -1))
    return out


@dataclass
class SampleTables:
    python: dict[str, object]  # the Python threads' on-CPU samples (ebpf.json python.samples)
    dispatched: dict[str, object]  # the other threads', with their dispatcher's stack
    rows: list[tuple[int, Any]]  # the log as read, for the native stacks
    lost: int  # samples past the log


def read_samples(bpf: BpfProgram, stack_index: dict[int, int], rate_hz: int) -> SampleTables:
    """The sampler's log, in time order: the Python threads' samples, and those of its other
    threads with their dispatcher's stack where the program found one (dispatcher 0: none)."""
    count = int(bpf["sample_count"][ctypes.c_int(0)].value)
    columns: dict[str, list[int]] = {"t_ns": [], "tid": [], "stack": []}
    dispatched: dict[str, list[int]] = {
        "t_ns": [],
        "tid": [],
        "dispatcher": [],
        "how": [],
        "stack": [],
    }
    lost = {"samples": 0}
    rows = read_log(bpf, "sample_log", count, lost, "samples")
    for _, v in rows:
        if v.python:
            columns["t_ns"].append(int(v.t_ns))
            columns["tid"].append(int(v.tid))
            columns["stack"].append(stack_index.get(int(v.stack), -1))
        else:
            dispatched["t_ns"].append(int(v.t_ns))
            dispatched["tid"].append(int(v.tid))
            dispatched["dispatcher"].append(int(v.dispatcher))
            dispatched["how"].append(int(v.dispatch))
            dispatched["stack"].append(stack_index.get(int(v.stack), -1))
    return SampleTables(
        {"rate_hz": rate_hz, **columns}, {"rate_hz": rate_hz, **dispatched}, rows, lost["samples"]
    )
