"""The eBPF collector: scheduler slices, wakeups, OpenMP parallel regions and on-CPU samples
of the target, with their Python stacks.

It decides and orders; the parts do the work. The process program is loaded through either
loader behind one interface (loaders/); the region probes go where placement/ says; what they
cost is measured as they run (costs.py), and the one policy (policy.py) says whether they stay
on; the window's maps are read into ebpf.json's tables after it (reader.py). Probes are
attached for the target only, and detached on every exit path (cleanup()).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...bundle.parts import EBPF, NATIVE, CollectorResult
from ...bundle.safefile import write_new
from ...host import procfs
from ...host.mapped import UnverifiedFile
from ...host.pyruntime import Layout
from ...host.target import Runtime, Target
from ..budget import REGION_PROBE_PART, SCHED_TRACE_PART
from ..collectors.base import Availability, CaptureContext
from . import costs, program
from .duty import RECOUNT_S, DutyCycle
from .loaders import LoaderName, LoaderUnavailable, LoadRequest, Program, load
from .loaders import bcc as bcc_loader
from .loaders import core as core_loader
from .logs import region_columns, sampled_count, slice_columns, unseen_ends
from .native import NATIVE_STACK_ENTRIES
from .placement.regions import KINDS, RuntimeProbes, Uprobe, find_probes, probeable, region_uprobes
from .policy import (
    RegionCount,
    RegionDecision,
    SchedCount,
    SchedDecision,
    Spent,
    count_between,
    decide_regions,
    decide_sched,
    needs_recount,
)
from .pywalk import PythonWalker
from .reader import ReadPlan, read_tables

# The walker's on-CPU sampling rate, per CPU: a prime off the timer ticks (as perf's 49 and 99),
# and cheap since every other process's sample returns at the first test.
PYTHON_SAMPLE_HZ = 49
# How long the rate check counts regions, and the scheduler's trial its switches.
RATE_CHECK_S = 0.3
SCHED_TRIAL_S = 0.25


def _bcc_loads() -> bool:
    try:
        bcc_loader.load_bcc()
    except bcc_loader.BccUnavailable:
        return False
    return True


@dataclass
class RegionCosts:
    """What a region of each probed copy costs its dispatching thread: the two traps (by the
    kind of instruction each sits on, calibrated) and the programs' run time (in place)."""

    traps: costs.TrapCost | None = None
    kinds: dict[int, tuple[bool, bool]] | None = None  # copy -> (entry emulated, end emulated)

    def trap_s(self, copy: int) -> float:
        if self.traps is None or self.kinds is None or copy not in self.kinds:
            return 0.0
        entry, end = self.kinds[copy]
        return self.traps.of(entry) + self.traps.of(end)


class EbpfCollector:
    name = "ebpf"

    def __init__(self, print_programs: bool = False) -> None:
        self.print_programs = print_programs
        self._program: Program | None = None
        self.loader: LoaderName = "bcc"
        self.loader_reason = ""  # why this loader ran, for the manifest and the report
        self.sched_decision: SchedDecision | None = None
        self.region_decision: RegionDecision | None = None
        self.region_note = ""  # why the probes went off, where a failure took them off
        self._cycle: DutyCycle | None = None  # set when the probes are switched on and off
        self._on_ns: list[tuple[int, int]] = []  # the switched probes' on-times
        self._context: CaptureContext | None = None
        self.slices = slice_columns()
        self.regions = region_columns()
        self.walker: PythonWalker | None = None
        self._region_probes: list[Uprobe] = []
        self._copies: list[RuntimeProbes] = []
        self.probed_runtimes: list[dict[str, object]] = []
        self.regions_detached = False
        self._costs = RegionCosts()
        self._stats = costs.StatsSwitch()
        self._sampling = False
        self._sched_on = False
        # The region-rate check runs while the other tools settle; the window waits for it.
        self._judged = threading.Event()
        self._judged.set()
        self._native = False
        self._sample_hz = PYTHON_SAMPLE_HZ
        self.lost = {"slices": 0, "regions": 0}
        self.attached: list[str] = []
        self.warnings: list[str] = []
        self._start_ns = 0

    def available(self, target: Target) -> Availability:
        core = core_loader.readiness()
        if not core:
            return Availability(True)
        try:
            bcc_loader.load_bcc()
        except bcc_loader.BccUnavailable as exc:
            return Availability(False, f"{exc}; and CO-RE cannot load: {core}")
        return Availability(True)

    def _choose_loader(self, asked: str) -> LoaderName:
        """The asked loader or, for auto, the prebuilt CO-RE object wherever the kernel has BTF
        and it loads (nothing compiled: a shorter start), else bcc."""
        if asked != "auto":
            self.loader_reason = f"asked for (--ebpf-loader {asked})"
            return "core" if asked == "core" else "bcc"
        why = core_loader.readiness()
        if not why:
            self.loader_reason = "auto: the kernel has BTF and the prebuilt program loads"
            return "core"
        self.loader_reason = f"auto: the prebuilt CO-RE program cannot load ({why})"
        self.warnings.append(f"eBPF through bcc: the prebuilt CO-RE program cannot load ({why})")
        return "bcc"

    # --- start ---

    def start(self, context: CaptureContext) -> None:
        self._context = context
        asked = context.options.ebpf_loader
        self.loader = self._choose_loader(asked)
        self._stats = costs.enable_stats()
        if not self._stats.on:
            self.warnings.append(f"the probes' run time is not measured: {self._stats.reason}")
        try:
            self._load(context)
        except LoaderUnavailable as exc:
            if self.loader != "core" or asked != "auto" or not _bcc_loads():
                self.cleanup(wait=True)
                raise
            # A kernel that refuses the prebuilt object (an old one without attach cookies)
            # may still take what bcc compiles for it.
            self._reset_for_bcc(f"eBPF through bcc: the prebuilt CO-RE program failed: {exc}")
            self._load(context)
        if self._region_probes:
            self._judged.clear()
            threading.Thread(
                target=self._judge_in_background,
                args=(context,),
                name="profkit-region-rate",
                daemon=True,
            ).start()
        # The scheduler's trial runs beside the region-rate check: both are moments of counting.
        try:
            if self._program is not None:
                self._decide_sched(context)
        except Exception:
            self._judged.wait()
            self.cleanup(wait=True)
            raise
        self._start_ns = context.clock()

    def _load(self, context: CaptureContext) -> None:
        """The process program for this capture: the sampler and walker, the region probes of
        every runtime copy, the scheduler tracepoints where they fit the budget."""
        target = context.target
        runtimes = tuple(probeable(target.runtimes))
        # The probe points are found (disassembly) and the walker prepared side by side.
        with ThreadPoolExecutor(max(1, min(4, len(runtimes)))) as pool:
            found = [pool.submit(self._find_probes, i, r) for i, r in enumerate(runtimes)]
            layout = self._prepare_walker(target, context.options.python_stacks != "off")
            self._native = (
                layout is not None
                and "perf_record" not in context.collectors
                and context.options.perf_callgraph == "fp"
            )
            if self._native:
                self._sample_hz = context.options.perf_rate_hz
            request = self._request(target.pid, layout, runtimes, sched=True, logs=True)
            if not (runtimes or layout is not None or context.options.ebpf_sched != "off"):
                return
            self._program = load(self.loader, request)
            self._copies = [c for c in (f.result() for f in found) if c is not None]
        try:
            self._attach_all(context, layout is not None)
        except Exception:
            self.cleanup(wait=True)
            raise

    def _request(
        self,
        pid: int,
        layout: Layout | None,
        runtimes: tuple[Runtime, ...],
        sched: bool,
        logs: bool,
    ) -> LoadRequest:
        cookies = tuple(
            program.entry_cookie(i, KINDS[r.name].requested_arg) for i, r in enumerate(runtimes)
        )
        capacities = (
            program.Capacities(native_stacks=NATIVE_STACK_ENTRIES if self._native else 0)
            if logs
            else program.COUNTERS_ONLY
        )
        return LoadRequest(
            pid=pid,
            layout=layout,
            capacities=capacities,
            runtimes=len(runtimes),
            entry_cookies=cookies,
            sched=sched,
            print_source=self.print_programs,
        )

    def _attach_all(self, context: CaptureContext, walker: bool) -> None:
        assert self._program is not None
        loaded = self._program
        if walker and self.walker is not None:
            self.walker.attach(loaded)
        if walker and self._sample_hz:
            loaded.attach_sampler(self._sample_hz)
            self._sampling = True
            what = "Python and native stacks" if self._native else "Python stacks"
            self.attached.append(f"perf_event:cpu-clock@{self._sample_hz}Hz ({what})")
        for copy in self._copies:
            self._attach_regions(copy)

    def _decide_sched(self, context: CaptureContext) -> None:
        """The scheduler's tracepoints: on or off as asked; auto, attached for a trial whose
        measured cost decides whether they stay."""
        assert self._program is not None
        setting = context.options.ebpf_sched
        budget = SCHED_TRACE_PART * context.options.budget.fraction
        count = None
        if setting != "off":
            seed_threads(self._program, context.target.pid)
            waking = self.walker is not None and self.walker.layout is not None
            attached = self._program.attach_sched(waking)
            if setting == "auto":
                count = self._sched_trial()
            decision = decide_sched(setting, count, budget)
            if decision.traced:
                self.attached += attached
                self._sched_on = True
            else:
                self._program.detach_sched()
        else:
            decision = decide_sched(setting, None, budget)
        self.sched_decision = decision
        if decision.reason():
            self.warnings.append(decision.reason())

    def _sched_trial(self) -> SchedCount | None:
        """Switches a second and the scheduler programs' run time a second, over a moment with
        them attached; None where the kernel keeps no statistics."""
        assert self._program is not None
        if not self._stats.on:
            return None
        names = self._sched_programs()
        switches_before = self._program.run_stats(names[:1])[0]
        _, ns_before = self._program.run_stats(names)
        began = time.monotonic()
        time.sleep(SCHED_TRIAL_S)
        seconds = time.monotonic() - began
        switches = self._program.run_stats(names[:1])[0] - switches_before
        _, ns = self._program.run_stats(names)
        return SchedCount(switches / seconds, (ns - ns_before) / seconds, costs.online_cpus())

    def _sched_programs(self) -> list[str]:
        """The scheduler's programs, the switch's first."""
        if self.loader == "core":
            return [*program.SCHED_PROGRAMS, program.WAKING_PROGRAM[0]]
        return [
            f"tracepoint__{point.replace(':', '__')}"
            for point in (*bcc_loader.SCHED_TRACEPOINTS, bcc_loader.WAKING_TRACEPOINT)
        ]

    def _find_probes(self, index: int, runtime: Runtime) -> RuntimeProbes | None:
        """One copy's probe points; a copy that cannot be read as the target maps it is left
        out with a note naming only the target's own name for it."""
        try:
            return find_probes(index, runtime)
        except UnverifiedFile as exc:
            self.warnings.append(f"no region probes: {exc}")
            return None

    def _prepare_walker(self, target: Target, wanted: bool) -> Layout | None:
        """The interpreter's layout, or None where the walker cannot (or is not to) run."""
        self.walker = PythonWalker(target.pid)
        if not (wanted and self.walker.prepare()):
            self.walker.reason = self.walker.reason or "Python stack walker off (--python-stacks)"
            self.warnings.append(self.walker.reason)
            return None
        return self.walker.layout

    def _reset_for_bcc(self, why: str) -> None:
        # Start bcc from nothing: no CO-RE map, link or record of it is left behind.
        self.cleanup(wait=True)
        self.loader = "bcc"
        self.loader_reason = f"auto: {why.removeprefix('eBPF through bcc: ')}"
        self.warnings = [why]
        self.attached = []
        self.sched_decision = None
        self._region_probes, self._copies, self.probed_runtimes = [], [], []
        self._stats = costs.enable_stats()
        self._judged.set()

    def _attach_regions(self, copy: RuntimeProbes) -> None:
        """One runtime copy's entry and end probes; a copy that refuses them is left out with
        a warning, the rest go on."""
        assert self._program is not None
        probes = region_uprobes(copy)
        try:
            self._program.attach_regions(probes)
        except Exception as exc:  # a stripped or unusual runtime: the rest still works
            self.warnings.append(f"region probes in {copy.runtime.path} failed: {exc}")
            return
        if any(p.retprobe for p in probes):
            self.warnings.append(
                f"the returns of {', '.join(e.symbol for e in copy.entries)} in "
                f"{copy.runtime.path} could not be found (capstone unavailable or an indirect "
                "jump): region ends come from a uretprobe, which makes py-spy --native's pauses "
                "longer"
            )
        self._region_probes += probes
        self.attached += [p.described for p in probes]
        self.probed_runtimes.append(copy.describe())

    # --- what the probes cost, and whether they stay ---

    def entries_by_copy(self) -> dict[int, int]:
        """Regions entered so far, by probed runtime copy (its index)."""
        if self._program is None:
            return {}
        table = self._program["runtime_entries"]
        return {c.index: int(table[ctypes.c_int(c.index)].value) for c in self._copies}

    def measured(self) -> Spent:
        """What the region probes have spent so far: regions entered, the region programs' run
        time, and each copy's regions at its own traps' calibrated cost."""
        if self._program is None:
            return Spent()
        return self._spent(self.entries_by_copy(), self._program_ns())

    def _program_ns(self) -> int:
        """The region programs' run time so far (the kernel's statistics; 0 where none)."""
        if self._program is None:
            return 0
        return self._program.run_stats([*self._program.entry_programs(), program.REGION_END])[1]

    def _spent(self, entries: dict[int, int], program_ns: int) -> Spent:
        traps_ns = sum(n * self._costs.trap_s(i) for i, n in entries.items()) * 1e9
        return Spent(sum(entries.values()), program_ns, traps_ns)

    def calibrate(self) -> costs.TrapCost | None:
        """The traps' cost on this machine (costs.py), once per process."""
        if self._program is None:
            return None
        found = costs.calibrate(
            self._program.name, self._program.attach_calibration, self._program.detach_calibration
        )
        self._costs = RegionCosts(found, {c.index: c.traps() for c in self._copies})
        return found

    def region_count(self, before: Spent, seconds: float) -> RegionCount:
        """Regions a second since `before` (measured() then), and what a region was measured
        to cost: its traps, weighed by each copy's regions, and the programs' run time over
        them. No region: a rate of 0 at the cheapest copy's traps."""
        count = count_between(before, self.measured(), seconds)
        if count is not None:
            return count
        return RegionCount(0.0, min((self._costs.trap_s(c.index) for c in self._copies), default=0))

    def _judge_in_background(self, context: CaptureContext) -> None:
        try:
            self._judge_region_rate(context)
        except Exception as exc:  # a failed check must not leave probes of unknown cost on
            self._detach_regions(f"OpenMP region probes detached: the rate check failed: {exc}")
        finally:
            self._judged.set()

    def _judge_region_rate(self, context: CaptureContext) -> None:
        """Count each copy's regions for a moment since the probes went on, with what they
        cost (the traps calibrated meanwhile, the programs' run time in place), and carry out
        the policy's decision."""
        entries, program_ns, began = self.entries_by_copy(), self._program_ns(), time.monotonic()
        self.calibrate()  # its own thread's CPU; the target's regions go on meanwhile
        # Both readings weigh the traps at the calibrated cost, the first one too.
        before = self._spent(entries, program_ns)
        remaining = RATE_CHECK_S - (time.monotonic() - began)
        if remaining > 0:
            time.sleep(remaining)
        first = self.region_count(before, time.monotonic() - began)
        budget = REGION_PROBE_PART * context.options.budget.fraction
        again = None
        if needs_recount(first, budget):
            # The check ran while the other tools started, and can count fewer regions than
            # the window sees: near the part, it counts again, and judges by the higher rate.
            before, began = self.measured(), time.monotonic()
            time.sleep(RECOUNT_S)
            again = self.region_count(before, time.monotonic() - began)
        walker = self.walker is not None and self.walker.layout is not None
        placed_by = (
            "its workers' samples"
            if self._sampling
            else "py-spy's native stacks"
            if "pyspy" in context.collectors
            else ""
        )
        decision = decide_regions(first, budget, stacks=walker, placed_by=placed_by, again=again)
        self.region_decision = decision
        if decision.action == "keep":
            return
        if decision.action == "detach":
            self._detach_regions(decision.reason())
            return
        self.warnings.append(decision.reason())
        self._cycle = DutyCycle(
            decision,
            context.clock,
            self._attach_probes,
            self._detach_probes,
            window_s=context.duration_s,
            measure=self.measured,
        )
        self._cycle.start(again.per_s if again is not None else None)

    def wait_started(self, stop: threading.Event) -> None:
        """Return once the region-rate check has decided whether the region probes stay, so
        that the window holds one set of probes from start to end (or at a Ctrl-C)."""
        while not self._judged.wait(0.05) and not stop.is_set():
            pass
        if self._cycle is not None:
            self._cycle.window_opened()

    def _detach_regions(self, reason: str) -> None:
        self.region_note = reason
        self.warnings.append(reason)
        # Only the region probes go: the walker's sampler stays on the same program.
        with contextlib.suppress(Exception):
            self._detach_probes(True)
            self._detach_probes(False)
        self._region_probes = []
        self.regions_detached = True
        self.attached = [a for a in self.attached if not a.startswith(("uprobe:", "uretprobe:"))]

    def attach_region_probes(self, entries: bool) -> None:
        """The entry probes (True) or the end probes (False) on again (DutyCycle's attach)."""
        self._attach_probes(entries)

    def detach_region_probes(self, entries: bool) -> None:
        """The entry probes (True) or the end probes (False) off (DutyCycle's detach)."""
        self._detach_probes(entries)

    def _attach_probes(self, entries: bool) -> None:
        assert self._program is not None
        self._program.attach_regions([p for p in self._region_probes if p.entry == entries])

    def _detach_probes(self, entries: bool) -> None:
        if self._program is not None:
            self._program.detach_regions(entries)

    def _stop_cycle(self) -> None:
        if self._cycle is None:
            return
        cycle, self._cycle = self._cycle, None
        self._on_ns = list(cycle.stop())
        if cycle.error:
            self.warnings.append(cycle.error)
        self._cycle_facts = cycle

    # --- watch: counters only ---

    def load_counters(
        self, target: Target, python_stacks: bool = True, loader: str = "auto"
    ) -> None:
        """For a long-running reader (profkit watch): the walker and every runtime copy's
        region probes with no logs, no sampler and no scheduler tracepoints; the cumulative maps
        (pystack_stats, runtime_entries) are read as often as wanted, and cleanup() detaches."""
        layout = self._prepare_walker(target, python_stacks)
        self.loader = self._choose_loader(loader)
        self._stats = costs.enable_stats()
        runtimes = tuple(probeable(target.runtimes))
        with ThreadPoolExecutor(max(1, min(4, len(runtimes)))) as pool:
            found = [pool.submit(self._find_probes, i, r) for i, r in enumerate(runtimes)]
            copies = [c for c in (f.result() for f in found) if c is not None]
        if not copies:
            return
        self._program = load(self.loader, self._request(target.pid, layout, runtimes, False, False))
        self._copies = copies
        try:
            if layout is not None and self.walker is not None:
                self.walker.attach(self._program)
            for copy in copies:
                self._attach_regions(copy)
        except Exception:
            self.cleanup(wait=True)
            raise

    @property
    def program(self) -> Program | None:
        """The target's loaded process program, for a reader of its counters (profkit watch);
        None before load and after cleanup."""
        return self._program

    def progress(self) -> int:
        if self._program is None:
            return 0
        try:
            return int(self._program["region_count"][ctypes.c_int(0)].value)
        except Exception:
            return 0

    # --- stop ---

    def stop(self) -> CollectorResult:
        assert self._context is not None
        self._judged.wait(timeout=5)  # a window cut short by a signal may end before the check
        self._stop_cycle()
        end_ns = self._context.clock()
        measured = self._measured_costs()
        # The region counters while every probe is still on: the links close in any order, and
        # regions entered after an end probe went but before its entry probe did would read as
        # regions without an end. The log is read up to this count of ended regions.
        counts = unseen_ends(self._program) if self._program is not None else None
        if self._program is not None:
            # Every probe off as the window ends; the kernel's waits for their closes overlap
            # the reading below and the report (the maps stay readable).
            self._program.detach()
        plan = ReadPlan(
            target=self._context.target,
            end_ns=end_ns,
            counts=counts,
            regions_detached=self.regions_detached,
            on_ns=tuple(self._on_ns),
            sampling=self._sampling,
            native=self._native,
            sample_hz=self._sample_hz,
            name_frames=self.loader == "core",
            sched=self._sched_on,
        )
        loader = self.loader_record()  # before cleanup() lets the program go
        try:
            tables = read_tables(self._program, self.walker, plan, self.lost)
        finally:
            self.cleanup()
        self.warnings += tables.warnings
        over = tables.python.get("threads_over_capacity")
        if isinstance(over, int) and over:
            self.warnings.append(
                f"{over} Python threads past the stack walker's thread map: their own stacks "
                "are not read (the pool's sites come from the threads it holds)"
            )
        self.slices, self.regions = tables.slices, tables.regions
        native_notes: dict[str, object] = {}
        if tables.native is not None:
            write_new(self._context.directory / NATIVE, json.dumps(tables.native))
            native_notes = {
                "native_samples": len(tables.native["samples"]["t_ns"]),
                "native_stacks_lost": tables.native["lost"],
                "native_rate_hz": self._sample_hz,
            }
        payload: dict[str, object] = {
            "threads": tables.threads,
            "wakeups": tables.wakeups,
            "histogram_us_log2": tables.histogram_us_log2,
        }
        if tables.region_entries is not None:
            payload["region_entries"] = tables.region_entries
        regions = self.regions_record(tables.regions_before_on_times, tables.regions_after_on_times)
        return self._finish(payload, end_ns, native_notes, tables.python, loader, regions, measured)

    def regions_record(self, before_on_times: int, after_on_times: int) -> dict[str, object]:
        """ebpf.json's regions_decision: the policy's decision and what the window then did."""
        cycle = getattr(self, "_cycle_facts", None)
        # Switched, the duty and the count it was set from are the switching's last.
        decision = cycle.outcome if cycle is not None else self.region_decision
        record = decision.as_record() if decision else {}
        if self.region_note:
            record["reason"] = self.region_note
            record["traced"] = False
            record["action"] = "detach"
        if cycle is not None:
            record["regions_per_s_recounted"] = round(cycle.recounted_per_s)
            record["on_ns"] = [list(interval) for interval in self._on_ns]
            record["probed_s"] = round(cycle.probed_s, 3)
            record["regions_before_on_times"] = before_on_times
            record["regions_after_on_times"] = after_on_times
        return record

    def _measured_costs(self) -> dict[str, object]:
        """ebpf.json's costs: what was measured, and how (docs/bundle.md)."""
        found: dict[str, object] = {
            "stats": "on" if self._stats.on else f"off: {self._stats.reason}",
        }
        if self._costs.traps is not None:
            found["traps"] = self._costs.traps.as_record()
        if self._program is None or not self._stats.on:
            return found
        runs: dict[str, dict[str, float]] = {}
        names = [
            *self._program.entry_programs(),
            program.REGION_END,
            program.SAMPLER,
            *(self._sched_programs() if self._sched_on else []),
        ]
        for name in names:
            count, ns = self._program.run_stats([name])
            if count:
                runs[name] = {"runs": count, "ns_per_run": round(ns / count, 1)}
        found["programs"] = runs
        spent = self.measured()
        if spent.entries:
            found["region_us"] = round((spent.trap_ns + spent.program_ns) / spent.entries / 1e3, 3)
        return found

    def loader_record(self) -> dict[str, object]:
        """Which loader ran, its version and why it was chosen."""
        if self._program is not None:
            return self._program.record(self.loader_reason)
        if self.loader == "core":
            return {"name": "core", "version": "", "reason": self.loader_reason}
        return {
            "name": "bcc",
            "version": f"bcc {bcc_loader.bcc_version()}",
            "reason": self.loader_reason,
        }

    def _finish(
        self,
        payload: dict[str, object],
        end_ns: int,
        native_notes: dict[str, object],
        python: dict[str, object],
        loader: dict[str, object],
        regions: dict[str, object],
        measured: dict[str, object],
    ) -> CollectorResult:
        """ebpf.json written, whichever loader ran; the collector's result."""
        assert self._context is not None
        sched = self.sched_decision.as_record() if self.sched_decision else {}
        payload.update(
            {
                "slices": self.slices,
                "regions": self.regions,
                "python": python,
                "lost": self.lost,
                "attached": self.attached,
                "warnings": self.warnings,
                "sched": sched,
                "regions_decision": regions,
                "costs": measured,
                "window": {"start_ns": self._start_ns, "end_ns": end_ns},
                "runtime": (
                    self._context.target.openmp_runtime.path
                    if self._context.target.openmp_runtime
                    else None
                ),
                # Every runtime copy whose region probes went on; regions.runtime indexes it.
                "runtimes": self.probed_runtimes,
                "loader": loader,
            }
        )
        write_new(self._context.directory / EBPF, json.dumps(payload))
        return CollectorResult(
            self.name,
            "ok",
            "; ".join(self.warnings),
            samples=len(self.slices["tid"]) + len(self.regions["tid"]) + sampled_count(python),
            lost=sum(self.lost.values()),
            start_ns=self._start_ns,
            end_ns=end_ns,
            files=(EBPF, NATIVE) if native_notes else (EBPF,),
            notes={
                **native_notes,
                "attached": self.attached,
                "regions": len(self.regions["tid"]),
                "slices": len(self.slices["tid"]),
                "regions_with_python_stack": sum(1 for i in self.regions["stack"] if i >= 0),
                "python_walker": python.get("walker"),
                "lost": dict(self.lost),
                "loader": loader,
            },
        )

    def cleanup(self, wait: bool = False) -> None:
        """Detach every probe; safe to call more than once. The CO-RE object's links close on a
        thread of their own unless `wait`: the probes stop as their closes begin, and the
        kernel's grace periods after that need not hold up the report."""
        self._judged.wait(timeout=5)  # the rate check reads and detaches the region probes
        self._stop_cycle()
        if self.walker is not None:
            self.walker.halt()
        loaded, self._program = self._program, None
        if loaded is not None:
            loaded.close(wait=wait)  # every probe at once, region probes included
        self._stats.close()


def seed_threads(loaded: Program, pid: int) -> None:
    """The target's threads as they are, so that the scheduler's times start from them; as
    many as the map holds (a target's thread count is its own to choose)."""
    times = loaded["times"]
    for tid in procfs.list_tids(pid):
        try:
            times[times.Key(tid)] = times.Leaf()
        except Exception:  # full (E2BIG; bcc raises a bare Exception): the rest start unseen
            return
