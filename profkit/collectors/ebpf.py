"""eBPF (bcc): scheduler slices, wakeups and OpenMP parallel regions of the target.

The programs live in probes/*.bpf.c and ship inside the wheel as profkit.probes. Each is wrapped
in a small class that renders its source for one target, so templating is tested without root.
Probes are attached with pid=TARGET only, and detached by BPF.cleanup() on every exit path.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources

from .. import procfs
from ..bccload import BccUnavailable, load_bcc
from ..budget import REGION_PROBE_SHARE, SCHED_TRACE_SHARE, sched_trace_share
from ..clock import Clock
from ..probe_points import ProbePoint, entry_point, gomp_region_end, hit_cost_s
from ..returns import return_sites
from ..safefile import write_new
from ..target import Runtime, Target
from .base import Availability, CaptureContext, CollectorResult
from .pywalk import PythonWalker

NORMALISED_FILE = "ebpf.json"
# The walker's on-CPU sampling rate, per CPU: a prime off the timer ticks (as perf's 49 and 99),
# and cheap since every other process's sample returns at the first test.
PYTHON_SAMPLE_HZ = 49


def probe_source(name: str) -> str:
    return resources.files("profkit.probes").joinpath(name).read_text()


@dataclass(frozen=True)
class SchedProgram:
    tgid: int
    slice_capacity: int = 1 << 19  # about 12 MiB of kernel memory; 1 turns the log off

    def source(self) -> str:
        text = probe_source("sched.bpf.c")
        return text.replace("TARGET_TGID", str(self.tgid)).replace(
            "SLICE_CAPACITY", str(max(1, self.slice_capacity))
        )


@dataclass(frozen=True)
class OpenMPProgram:
    """The target's process program: the Python stack walker and its on-CPU sampler
    (probes/pystack.bpf.c, active when compiled with the walker's flags) and the OpenMP region
    probes (probes/openmp.bpf.c), compiled as one."""

    runtime: Runtime | None
    tgid: int = 0

    @property
    def entry(self) -> tuple[str, str]:
        """(symbol, handler) of the runtime's fork entry point."""
        if self.runtime is not None and self.runtime.name == "libiomp5":
            return "__kmpc_fork_call", "on_kmpc_fork_call"
        return "GOMP_parallel", "on_gomp_parallel"

    region_capacity: int = 1 << 18  # 8 MiB of kernel memory: 2.5 min at 1 700 regions/s
    sample_capacity: int = 1 << 17  # 3 MiB: 22 min of two CPUs sampled at PYTHON_SAMPLE_HZ

    def source(self) -> str:
        walker = (
            probe_source("pystack.bpf.c")
            .replace("TARGET_TGID", str(self.tgid))
            .replace("SAMPLE_CAPACITY", str(self.sample_capacity))
        )
        regions = probe_source("openmp.bpf.c").replace("REGION_CAPACITY", str(self.region_capacity))
        return walker + regions


def decide_sched(context: CaptureContext, switches: SwitchRate | None = None) -> dict[str, object]:
    """Whether to trace the scheduler: its tracepoints run on every context switch of the
    machine, so on a busy one they cost more than their share of the budget
    (docs/collectors.md)."""
    setting = context.options.get("ebpf_sched", "auto")
    if setting != "auto":
        return {
            "traced": setting == "on",
            "setting": setting,
            "reason": "" if setting == "on" else "scheduler tracepoints off (--ebpf-sched off)",
        }
    budget = SCHED_TRACE_SHARE * float(context.options.get("overhead_budget", "0.02"))
    rate = (switches or SwitchRate(context.clock)).rate()
    share = sched_trace_share(rate, os.cpu_count() or 1)
    decision: dict[str, object] = {
        "traced": share <= budget,
        "setting": "auto",
        "switches_per_s": round(rate),
        "expected_share": share,
    }
    decision["reason"] = (
        ""
        if share <= budget
        else (
            f"scheduler tracepoints skipped: the machine switches {rate:,.0f} times a second on "
            f"{os.cpu_count()} CPUs, which would cost the target ~{100 * share:.1f}%, over "
            f"their {100 * budget:.2g}% share of the budget (--ebpf-sched on to trace anyway)"
        )
    )
    return decision


class SwitchRate:
    """Context switches per second on the whole machine, from /proc/stat's ctxt, counted from
    construction: the start-up work in between is measured over rather than slept through."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.before, self.start = procfs.read_context_switches(), clock()

    def rate(self, at_least_s: float = 0.25) -> float:
        remaining = at_least_s - (self.clock() - self.start) / 1e9
        if remaining > 0:
            time.sleep(remaining)
        after, end = procfs.read_context_switches(), self.clock()
        return (after - self.before) / max(1e-9, (end - self.start) / 1e9)


def machine_switch_rate(clock: Clock, seconds: float = 0.25) -> float:
    return SwitchRate(clock).rate(seconds)


@dataclass(frozen=True)
class RegionPoints:
    """Where the region probes of one runtime go (profkit/probe_points.py)."""

    symbol: str
    handler: str
    entry: ProbePoint | None
    end: ProbePoint | None
    returns: list[int] | None


def region_points(program: OpenMPProgram) -> RegionPoints:
    assert program.runtime is not None
    symbol, handler = program.entry
    path = program.runtime.path
    entry = entry_point(path, symbol)
    end = gomp_region_end(path) if symbol == "GOMP_parallel" else None
    returns = None if end else return_sites(path, symbol)
    return RegionPoints(symbol, handler, entry, end, returns)


class EbpfCollector:
    name = "ebpf"

    def __init__(self, print_programs: bool = False) -> None:
        self.print_programs = print_programs
        self._bpf: list[object] = []  # every loaded program, for cleanup
        self._sched_bpf: object | None = None
        self._openmp_bpf: object | None = None
        self.sched_decision: dict[str, object] = {}
        self.region_decision: dict[str, object] = {}
        self._region_hit_s = 0.0
        self._context: CaptureContext | None = None
        self.slices: dict[str, list[int]] = {
            "start_ns": [],
            "end_ns": [],
            "tid": [],
            "voluntary": [],
        }
        self.regions: dict[str, list[int]] = {
            "start_ns": [],
            "end_ns": [],
            "tid": [],
            "requested": [],
            "stack": [],  # index into the walker's stacks, -1 for none
        }
        self.walker: PythonWalker | None = None
        self._region_probes: list[tuple[str, dict[str, object]]] = []
        self.regions_detached = False
        self._sampling = False
        self.lost = {"slices": 0, "regions": 0}
        self.attached: list[str] = []
        self.warnings: list[str] = []
        self._start_ns = 0

    def available(self, target: Target) -> Availability:
        try:
            load_bcc()
        except BccUnavailable as exc:
            return Availability(False, str(exc))
        return Availability(True)

    def start(self, context: CaptureContext) -> None:
        bcc = load_bcc()
        self._context = context
        target = context.target
        sched = SchedProgram(target.pid)
        runtime = target.openmp_runtime
        program = OpenMPProgram(runtime, target.pid)
        self.walker = PythonWalker(target.pid)
        flags = self.walker.prepare() if context.options.get("python_stacks") != "off" else []
        if not flags:
            self.walker.reason = self.walker.reason or "Python stack walker off (--python-stacks)"
            self.warnings.append(self.walker.reason)
        if self.print_programs:
            print(f"/* --- sched --- */\n{sched.source()}")
            print(f"/* --- process ({' '.join(flags)}) --- */\n{program.source()}")
        switches = SwitchRate(context.clock)
        found: RegionPoints | None = None
        try:
            if runtime is not None or flags:
                # objdump finds the probe points while clang compiles: both run outside the GIL.
                with ThreadPoolExecutor(1) as pool:
                    points = pool.submit(region_points, program) if runtime else None
                    bpf = bcc.BPF(text=program.source(), cflags=flags)  # type: ignore[attr-defined]
                    found = points.result() if points else None
                self._bpf.append(bpf)
                self._openmp_bpf = bpf
                if flags:
                    self._attach_sampler(bcc, bpf)
                    self.walker.attach(bpf)
                if found is not None:
                    self._attach_openmp(program, target.pid, found)
            regions_from = (context.clock(), _entries(self._openmp_bpf) if found else 0)
            self.sched_decision = decide_sched(context, switches)
            if self.sched_decision["traced"]:
                sched_bpf = bcc.BPF(text=sched.source())
                self._bpf.append(sched_bpf)
                self._sched_bpf = sched_bpf
                self._seed_threads(sched_bpf, target.pid)
                self.attached += [
                    "tracepoint:sched:sched_switch",
                    "tracepoint:sched:sched_wakeup",
                    "tracepoint:sched:sched_wakeup_new",
                ]
            else:
                self.warnings.append(str(self.sched_decision["reason"]))
            if found is not None and self._region_probes:
                self._judge_region_rate(context, *regions_from)
        except Exception:
            self.cleanup()
            raise
        self._start_ns = context.clock()

    def _attach_sampler(self, bcc: object, bpf: object) -> None:
        """The walker's on-CPU sampler: a cpu-clock event on every CPU, kept to the target's
        Python threads by the program."""
        bpf.attach_perf_event(  # type: ignore[attr-defined]
            ev_type=bcc.PerfType.SOFTWARE,  # type: ignore[attr-defined]
            ev_config=bcc.PerfSWConfig.CPU_CLOCK,  # type: ignore[attr-defined]
            fn_name="on_cpu_sample",
            sample_freq=PYTHON_SAMPLE_HZ,
        )
        self._sampling = True
        self.attached.append(f"perf_event:cpu-clock@{PYTHON_SAMPLE_HZ}Hz (Python stacks)")

    def _attach_openmp(self, program: OpenMPProgram, pid: int, points: RegionPoints) -> None:
        assert program.runtime is not None and self._openmp_bpf is not None
        symbol, handler = points.symbol, points.handler
        entry, end, returns = points.entry, points.end, points.returns
        path = program.runtime.path
        bpf = self._openmp_bpf

        def probe(kind: str, **where: object) -> None:
            getattr(bpf, f"attach_{kind}")(name=path, pid=pid, **where)
            self._region_probes.append((kind, {"name": path, "pid": pid, **where}))

        try:
            if entry:
                probe("uprobe", addr=entry.address, fn_name=handler)
            else:
                probe("uprobe", sym=symbol, fn_name=handler)
            if end:
                probe("uprobe", addr=end.address, fn_name="on_region_return")
            elif returns:
                # A uprobe on each `ret` rather than a uretprobe: see profkit/returns.py.
                for address in returns:
                    probe("uprobe", addr=address, fn_name="on_region_return")
            else:
                probe("uretprobe", sym=symbol, fn_name="on_region_return")
                self.warnings.append(
                    f"the returns of {symbol} could not be found (objdump/readelf missing or "
                    "an indirect jump): region ends come from a uretprobe, which makes "
                    "py-spy --native's pauses longer"
                )
        except Exception as exc:  # a stripped or unusual runtime: the rest still works
            self.warnings.append(f"uprobe on {symbol} in {path} failed: {exc}")
            return
        self._region_hit_s = hit_cost_s(entry) + hit_cost_s(end)
        self.attached.append(
            f"uprobe:{path}:{entry.address:#x} ({symbol} entry, {entry.instruction})"
            if entry
            else f"uprobe:{path}:{symbol}"
        )
        if end:
            self.attached.append(
                f"uprobe:{path}:{end.address:#x} (region end, after the team barrier)"
            )
        elif returns:
            self.attached += [
                f"uprobe:{path}:{address:#x} (return of {symbol})" for address in returns
            ]
        else:
            self.attached.append(f"uretprobe:{path}:{symbol}")

    def _judge_region_rate(
        self, context: CaptureContext, start: int, before: int, seconds: float = 0.3
    ) -> None:
        """Count regions for a moment since the probes went on (start, before); detach them
        when their traps would cost the dispatching thread more than its share of the budget
        (a loop of small parallel ops can start 100 000 regions a second: 2 us each is then
        20% of its time)."""
        bpf = self._openmp_bpf
        if bpf is None:
            return
        remaining = seconds - (context.clock() - start) / 1e9
        if remaining > 0:
            time.sleep(remaining)
        rate = (_entries(bpf) - before) / max(1e-9, (context.clock() - start) / 1e9)
        budget = REGION_PROBE_SHARE * float(context.options.get("overhead_budget", "0.02"))
        share = rate * self._region_hit_s
        self.region_decision = {
            "traced": share <= budget,
            "regions_per_s": round(rate),
            "cost_per_region_us": round(self._region_hit_s * 1e6, 1),
            "expected_share": share,
        }
        if share <= budget:
            return
        reason = (
            f"OpenMP region probes detached: the target started {rate:,.0f} regions a second, "
            f"~{100 * share:.1f}% of its dispatching thread at {1e6 * self._region_hit_s:.1f} us "
            f"per region, over their {100 * budget:g}% share of the budget; attribution falls "
            "back to py-spy's native stacks"
        )
        self.region_decision["reason"] = reason
        self.warnings.append(reason)
        # Only the region probes go: the walker's sampler stays on the same program.
        for kind, where in self._region_probes:
            where = {k: v for k, v in where.items() if k != "fn_name"}
            with contextlib.suppress(Exception):
                getattr(bpf, f"detach_{kind}")(**where)
        self._region_probes = []
        self.regions_detached = True
        self.attached = [a for a in self.attached if not a.startswith(("uprobe:", "uretprobe:"))]

    def _seed_threads(self, bpf: object, pid: int) -> None:
        times = bpf["times"]  # type: ignore[index]
        for tid in procfs.list_tids(pid):
            times[times.Key(tid)] = times.Leaf()

    def progress(self) -> int:
        if self._openmp_bpf is None:
            return 0
        try:
            return int(self._openmp_bpf["region_count"][ctypes.c_int(0)].value)  # type: ignore[index]
        except Exception:
            return 0

    def stop(self) -> CollectorResult:
        assert self._context is not None
        end_ns = self._context.clock()
        payload: dict[str, object] = {"threads": {}, "wakeups": [], "histogram_us_log2": {}}
        if self._sched_bpf is not None:
            sched = self._sched_bpf
            threads = {}
            for key, value in sched["times"].items():  # type: ignore[index]
                oncpu, offcpu = value.oncpu_ns, value.offcpu_ns
                # Close the interval each thread is in at the end of the window.
                if value.last_in_ns:
                    oncpu += max(0, end_ns - value.last_in_ns)
                elif value.last_out_ns:
                    offcpu += max(0, end_ns - value.last_out_ns)
                threads[str(key.value)] = {
                    "oncpu_ns": oncpu,
                    "offcpu_ns": offcpu,
                    "voluntary": value.voluntary,
                    "involuntary": value.involuntary,
                }
            payload["threads"] = threads
            self._read_slices(sched)
            payload["wakeups"] = [[k.waker, k.wakee, v.value] for k, v in sched["wakeups"].items()]  # type: ignore[index]
        python: dict[str, object] = {"walker": "off", "reason": "no OpenMP region probe"}
        if self.walker is not None:
            python["reason"] = self.walker.reason
        if self._openmp_bpf is not None:
            # One snapshot of both counters, then the log up to it: the target goes on
            # starting regions while the log is read.
            entries, ended = self._check_ends(self._openmp_bpf)
            stack_index: dict[int, int] = {}
            if self.walker is not None and self.walker.layout is not None:
                python, stack_index = self.walker.read()
            if not self.regions_detached:
                self._read_regions(self._openmp_bpf, ended, stack_index)
            if self._sampling:
                python["samples"] = self._read_samples(self._openmp_bpf, stack_index)
            payload["region_entries"] = entries
            hist = self._openmp_bpf["duration_us_log2"]  # type: ignore[index]
            payload["histogram_us_log2"] = {
                str(k.value): v.value for k, v in hist.items() if v.value
            }
        self.cleanup()
        payload.update(
            {
                "slices": self.slices,
                "regions": self.regions,
                "python": python,
                "lost": self.lost,
                "attached": self.attached,
                "warnings": self.warnings,
                "sched": self.sched_decision,
                "regions_decision": self.region_decision,
                "window": {"start_ns": self._start_ns, "end_ns": end_ns},
                "runtime": (
                    self._context.target.openmp_runtime.path
                    if self._context.target.openmp_runtime
                    else None
                ),
            }
        )
        write_new(self._context.directory / NORMALISED_FILE, json.dumps(payload))
        return CollectorResult(
            self.name,
            "ok",
            "; ".join(self.warnings),
            samples=len(self.slices["tid"]) + len(self.regions["tid"]),
            lost=sum(self.lost.values()),
            start_ns=self._start_ns,
            end_ns=end_ns,
            files=(NORMALISED_FILE,),
            notes={
                "attached": self.attached,
                "regions": len(self.regions["tid"]),
                "slices": len(self.slices["tid"]),
                "regions_with_python_stack": sum(1 for i in self.regions["stack"] if i >= 0),
                "python_walker": python.get("walker"),
                "lost": dict(self.lost),
            },
        )

    def _check_ends(self, bpf: object) -> tuple[int, int]:
        """Regions entered and ended so far; warns when ends went unseen."""
        entries = _entries(bpf)
        ended = int(bpf["region_count"][ctypes.c_int(0)].value)  # type: ignore[index]
        still_open = len(bpf["open_regions"])  # type: ignore[index]
        missed = entries - ended - still_open
        if missed > max(5, entries // 100):
            self.warnings.append(
                f"{missed} of {entries} OpenMP regions ended where the end probe did not see "
                "them: region times are incomplete"
            )
        return entries, ended

    def _read_regions(self, bpf: object, count: int, stack_index: dict[int, int]) -> None:
        """Copy the in-kernel region log out in one batch, after the window."""
        for _, v in _read_log(bpf, "region_log", count, self.lost, "regions"):
            for key in ("start_ns", "end_ns", "tid", "requested"):
                self.regions[key].append(getattr(v, key))
            self.regions["stack"].append(stack_index.get(int(v.stack), -1))

    def _read_samples(self, bpf: object, stack_index: dict[int, int]) -> dict[str, object]:
        """The walker's on-CPU samples of the target's Python threads, in time order."""
        count = int(bpf["sample_count"][ctypes.c_int(0)].value)  # type: ignore[index]
        columns: dict[str, list[int]] = {"t_ns": [], "tid": [], "stack": []}
        lost = {"samples": 0}
        for _, v in _read_log(bpf, "sample_log", count, lost, "samples"):
            columns["t_ns"].append(int(v.t_ns))
            columns["tid"].append(int(v.tid))
            columns["stack"].append(stack_index.get(int(v.stack), -1))
        self.lost["python_samples"] = lost["samples"]
        return {"rate_hz": PYTHON_SAMPLE_HZ, **columns}

    def _read_slices(self, sched: object) -> None:
        """Copy the in-kernel slice log out in one batch, after the window."""
        count = sched["slice_count"][ctypes.c_int(0)].value  # type: ignore[index]
        for _, v in _read_log(sched, "slice_log", count, self.lost, "slices"):
            self.slices["start_ns"].append(v.start_ns)
            self.slices["end_ns"].append(v.end_ns)
            self.slices["tid"].append(v.tid)
            self.slices["voluntary"].append(v.voluntary)

    def cleanup(self) -> None:
        """Detach every probe; safe to call more than once."""
        if self.walker is not None:
            self.walker.halt()
        self._sched_bpf = self._openmp_bpf = None
        while self._bpf:
            bpf = self._bpf.pop()
            with contextlib.suppress(Exception):
                bpf.cleanup()  # type: ignore[attr-defined]


def _entries(bpf: object) -> int:
    return int(bpf["entry_count"][ctypes.c_int(0)].value)  # type: ignore[index]


def _read_log(bpf: object, log_name: str, count: int, lost: dict[str, int], which: str):  # type: ignore[no-untyped-def]
    """The first `count` entries of an in-kernel array log, in the order they were written."""
    log = bpf[log_name]  # type: ignore[index]
    capacity = len(log)
    used = min(count, capacity)
    lost[which] += max(0, count - capacity)
    if used <= 0 or capacity <= 1:
        return []
    try:
        entries = [(k.value, v) for k, v in log.items_lookup_batch()]
    except Exception:  # kernels without batch lookups: one lookup per entry
        entries = [(i, log[ctypes.c_int(i)]) for i in range(used)]
    return sorted(((index, v) for index, v in entries if index < used), key=lambda e: e[0])
