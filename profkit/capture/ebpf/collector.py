"""The eBPF collector: scheduler slices, wakeups, OpenMP parallel regions and on-CPU samples
of the target, with their Python stacks.

bcc compiles the programs (programs.py renders them for one target) where it loads; elsewhere
the prebuilt CO-RE process program loads through libbpf (core_program.py), with the same maps.
Probes are attached for the target only, and detached on every exit path (cleanup()). The
region probes are attached and switched through one interface for both loaders
(region_probes.py); their rate decides whether they stay on (region_policy.py); the logs are
read after the window (logs.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import ModuleType
from typing import Any

from ...bundle.parts import EBPF, NATIVE, CollectorResult
from ...bundle.safefile import write_new
from ...host import procfs
from ...host.target import Target
from ..budget import REGION_PROBE_PART
from ..collectors.base import Availability, CaptureContext
from . import libbpf
from .core_program import SCHED_PROGRAMS, load_process
from .duty import RECOUNT_S, DutyCycle
from .libbpf import CoreObject
from .loader import BccUnavailable, BpfProgram, bcc_version, detach_uprobes, load_bcc
from .logs import (
    SampleTables,
    read_regions,
    read_samples,
    read_sched,
    region_columns,
    sampled_count,
    slice_columns,
    unseen_ends,
)
from .native import NATIVE_STACK_ENTRIES, native_tables, read_stacks
from .programs import PYTHON_SAMPLE_HZ, OpenMPProgram, SchedProgram
from .pywalk import PythonWalker
from .region_policy import RegionCount, RegionOutcome, decide_regions, needs_recount
from .region_probes import BccRegionProbes, CoreRegionProbes, RegionProbes
from .regions import RuntimeProbes, Uprobe, find_probes, probeable, region_uprobes
from .scheduler import SchedDecision, SwitchRate, decide_sched

# What the Python stack walker adds to a region's entry trap at its full 32 frames, measured
# with benchmarks/probe_cost.py (docs/results/walker-cost.md).
WALKER_HIT_S = 1.4e-6
# Those figures, and the traps' (probe_points.py), come from a tight loop that keeps the trap
# path in the caches. In place the traps' own CPU is several times as much
# (docs/results/ebpf-cost.md#in-place-what-the-traps-cost-a-busy-server), and a serving front's
# own CPU grows by about this many times the loop's figure a region
# (docs/results/overhead.md#serving-at-64-threads-where-the-cost-lies). The rate check counts
# the latter: a loop whose trap path stays warm is then probed for less of the time than it
# could be, never more.
IN_PLACE = 5.0


def _bcc_loads() -> bool:
    try:
        load_bcc()
    except BccUnavailable:
        return False
    return True


class EbpfCollector:
    name = "ebpf"

    def __init__(self, print_programs: bool = False) -> None:
        self.print_programs = print_programs
        self._bpf: list[BpfProgram] = []  # every loaded program, for cleanup
        self._sched_bpf: BpfProgram | None = None
        # The target's process program, bcc's or the CO-RE object: both are read by map name.
        self._process: BpfProgram | CoreObject | None = None
        self.sched_decision: SchedDecision | None = None
        self._on_ns: list[tuple[int, int]] = []  # the switched probes' on-times
        self.region_outcome = RegionOutcome()
        self._context: CaptureContext | None = None
        self.slices = slice_columns()
        self.regions = region_columns()
        self.walker: PythonWalker | None = None
        self._region_probes: list[Uprobe] = []
        self._regions: RegionProbes | None = None
        self._hit_s: dict[int, float] = {}  # each probed copy's trap cost per region
        self.probed_runtimes: list[dict[str, object]] = []
        self.regions_detached = False
        self._cycle: DutyCycle | None = None  # set when the probes are switched on and off
        # The region-rate check runs while the other tools settle; the window waits for it.
        self._judged = threading.Event()
        self._judged.set()
        self._sampling = False
        self._dispatch_wakeups = False
        self.loader = "bcc"
        self.loader_reason = ""  # why this loader ran, for the manifest and the report
        self._core: CoreObject | None = None  # the CO-RE program, where it runs instead of bcc
        self._uprobe_links = "single"
        self._native = False
        self._sample_hz = PYTHON_SAMPLE_HZ
        self.lost = {"slices": 0, "regions": 0}
        self.attached: list[str] = []
        self.warnings: list[str] = []
        self._start_ns = 0

    def available(self, target: Target) -> Availability:
        core = libbpf.readiness()
        if not core:
            return Availability(True)
        try:
            load_bcc()
        except BccUnavailable as exc:
            return Availability(False, f"{exc}; and CO-RE cannot load: {core}")
        return Availability(True)

    def _choose_loader(self, asked: str) -> str:
        """The asked loader or, for auto, the prebuilt CO-RE object wherever the kernel has BTF
        and libbpf loads (nothing compiled: a shorter start), else bcc."""
        if asked != "auto":
            self.loader_reason = f"asked for (--ebpf-loader {asked})"
            return asked
        why = libbpf.readiness()
        if not why:
            self.loader_reason = "auto: the kernel has BTF and libbpf loads the prebuilt program"
            return "core"
        self.loader_reason = f"auto: the prebuilt CO-RE program cannot load ({why})"
        self.warnings.append(f"eBPF through bcc: the prebuilt CO-RE program cannot load ({why})")
        return "bcc"

    def start(self, context: CaptureContext) -> None:
        self._context = context
        asked = context.options.ebpf_loader
        self.loader = self._choose_loader(asked)
        if self.loader == "core":
            try:
                self._start_core(context)
            except libbpf.CoreUnavailable as exc:
                if asked != "auto" or not _bcc_loads():
                    raise
                # A kernel that refuses the prebuilt object (an old one without attach
                # cookies) may still take what bcc compiles for it.
                self._reset_for_bcc(f"eBPF through bcc: the prebuilt CO-RE program failed: {exc}")
                self._start_bcc(context)
        else:
            self._start_bcc(context)
        if self._region_probes:
            self._judged.clear()
            threading.Thread(
                target=self._judge_in_background,
                args=(context, context.clock(), self._entries_by_copy()),
                name="profkit-region-rate",
                daemon=True,
            ).start()
        self._start_ns = context.clock()

    def _start_bcc(self, context: CaptureContext) -> None:
        target = context.target
        switches = SwitchRate(context.clock)
        flags = self._prepare_walker(target, context.options.python_stacks != "off")
        # Decided before compiling, since the tracepoints are part of the one program: the
        # context-switch rate is counted over the walker's preparation.
        self.sched_decision = decide_sched(context, switches)
        traced = self.sched_decision.traced
        if not traced:
            self.warnings.append(self.sched_decision.reason)
        # Native stacks come from the walker's sampler unless perf record samples them in this
        # capture, or DWARF call graphs were asked for (only perf unwinds those).
        self._native = (
            bool(flags)
            and "perf_record" not in context.collectors
            and context.options.perf_callgraph == "fp"
        )
        program = OpenMPProgram(
            tuple(probeable(target.runtimes)),
            target.pid,
            sched=SchedProgram(target.pid) if traced else None,
            native_stacks=NATIVE_STACK_ENTRIES if self._native else 0,
            dispatch_wakeups=traced,
        )
        self._dispatch_wakeups = program.dispatch_wakeups
        self._load(program, flags, sample=True)

    def _start_core(self, context: CaptureContext) -> None:
        """The prebuilt process program through libbpf: what bcc's program does, from one
        object (the sampler and walker, the region probes of every runtime copy, the scheduler
        tracepoints where traced) attached program by program."""
        target = context.target
        switches = SwitchRate(context.clock)
        runtimes = tuple(probeable(target.runtimes))
        # The probe points are found (disassembly), the walker prepared and the switch rate
        # counted side by side: each takes a fraction of a second, and the load waits for all.
        with ThreadPoolExecutor(max(1, min(4, len(runtimes)))) as pool:
            found = [pool.submit(find_probes, i, r) for i, r in enumerate(runtimes)]
            walker = bool(self._prepare_walker(target, context.options.python_stacks != "off"))
            layout = self.walker.layout if walker and self.walker is not None else None
            self.sched_decision = decide_sched(context, switches)
            traced = self.sched_decision.traced
            if not traced:
                self.warnings.append(self.sched_decision.reason)
            self._native = (
                walker
                and "perf_record" not in context.collectors
                and context.options.perf_callgraph == "fp"
            )
            if self._native:
                self._sample_hz = context.options.perf_rate_hz
            program = OpenMPProgram(
                runtimes,
                target.pid,
                native_stacks=NATIVE_STACK_ENTRIES if self._native else 0,
            )
            if not (program.runtimes or walker or traced):
                return
            core = load_process(
                target.pid,
                layout,
                program.sample_capacity,
                program.region_capacity,
                SchedProgram(target.pid).slice_capacity if traced else 1,
                program.native_stacks,
            )
            probes = [p for p in (f.result() for f in found) if p is not None]
        self._core = self._process = core
        self._uprobe_links = "multi" if core.multi_uprobes else "single"
        self._regions = CoreRegionProbes(core, target.pid)
        try:
            if traced:
                self._sched_bpf = core
                self._seed_threads(core, target.pid)
                for name, event in SCHED_PROGRAMS.items():
                    core.attach(name)
                    self.attached.append(f"tp_btf:sched:{event}")
            if walker and self.walker is not None:
                core.attach_cpu_clock("on_cpu_sample", self._sample_hz)
                what = "Python and native stacks" if self._native else "Python stacks"
                self.attached.append(f"perf_event:cpu-clock@{self._sample_hz}Hz ({what})")
                if traced:
                    # Who wakes the pool's workers, for their samples: on every wakeup of the
                    # machine, so only where the scheduler's tracepoints fit the budget.
                    core.attach("on_waking")
                    self.attached.append("tp_btf:sched:sched_waking (dispatchers)")
                self._sampling = True
                self.walker.attach(core)
            for copy in probes:
                self._attach_regions(copy)
        except Exception:
            self.cleanup(wait=True)
            raise

    def wait_started(self, stop: threading.Event) -> None:
        """Return once the region-rate check has decided whether the region probes stay, so
        that the window holds one set of probes from start to end (or at a Ctrl-C)."""
        while not self._judged.wait(0.05) and not stop.is_set():
            pass
        if self._cycle is not None:
            self._cycle.window_opened()

    def _judge_in_background(self, context: CaptureContext, start: int, before: dict) -> None:
        try:
            self._judge_region_rate(context, start, before)
        except Exception as exc:  # a failed check must not leave probes of unknown cost on
            self._detach_regions(f"OpenMP region probes detached: the rate check failed: {exc}")
        finally:
            self._judged.set()

    def loader_record(self) -> dict[str, object]:
        """Which loader ran, its version and why it was chosen."""
        if self.loader == "core":
            return {
                "name": "core",
                "version": f"libbpf {libbpf.version()}",
                "libbpf": libbpf.version(),
                "reason": self.loader_reason,
                # How the region probes were linked: every point of a program in a file by one
                # link ("multi"), or a link a point.
                "uprobe_links": self._uprobe_links,
            }
        return {"name": "bcc", "version": f"bcc {bcc_version()}", "reason": self.loader_reason}

    def _reset_for_bcc(self, why: str) -> None:
        # bcc's uprobes cannot share an instruction with libbpf's (docs/install.md): gone first.
        self.cleanup(wait=True)
        self.loader = "bcc"
        self.loader_reason = f"auto: {why.removeprefix('eBPF through bcc: ')}"
        self.warnings = [why]
        self.attached = []
        self.sched_decision = None
        self._region_probes, self._hit_s, self.probed_runtimes = [], {}, []
        self._sampling = False

    def load_counters(
        self, target: Target, python_stacks: bool = True, loader: str = "auto"
    ) -> None:
        """For a long-running reader (profkit watch): the walker and every runtime copy's
        region probes with no logs, no sampler and no scheduler tracepoints; the cumulative maps
        (pystack_stats, runtime_entries) are read as often as wanted, and cleanup() detaches."""
        flags = self._prepare_walker(target, python_stacks)
        self.loader = self._choose_loader(loader)
        if self.loader == "core":
            self._load_core_counters(target, bool(flags))
            return
        program = OpenMPProgram(
            tuple(probeable(target.runtimes)), target.pid, region_capacity=1, sample_capacity=1
        )
        self._load(program, flags, sample=False)

    def _load_core_counters(self, target: Target, walker: bool) -> None:
        runtimes = tuple(probeable(target.runtimes))
        probes = [p for p in (find_probes(i, r) for i, r in enumerate(runtimes)) if p is not None]
        if not probes:
            return
        layout = self.walker.layout if walker and self.walker is not None else None
        core = load_process(target.pid, layout, 1, 1, 1, 0)  # logs of one entry: off
        self._core = self._process = core
        self._uprobe_links = "multi" if core.multi_uprobes else "single"
        self._regions = CoreRegionProbes(core, target.pid)
        try:
            if layout is not None and self.walker is not None:
                self.walker.attach(core)
            for copy in probes:
                self._attach_regions(copy)
        except Exception:
            self.cleanup(wait=True)
            raise

    @property
    def program(self) -> BpfProgram | None:
        """The target's loaded process program (bcc's or the CO-RE object), for a reader of
        its counters (profkit watch); None before load and after cleanup."""
        return self._process

    def _prepare_walker(self, target: Target, wanted: bool) -> list[str]:
        self.walker = PythonWalker(target.pid)
        flags = self.walker.prepare() if wanted else []
        if not flags:
            self.walker.reason = self.walker.reason or "Python stack walker off (--python-stacks)"
            self.warnings.append(self.walker.reason)
        return flags

    def _load(self, program: OpenMPProgram, flags: list[str], sample: bool) -> None:
        """Compile the process program and attach what it holds; on any failure nothing stays
        attached."""
        if self.print_programs:
            print(f"/* --- process ({' '.join(flags)}) --- */\n{program.source()}")
        if not (program.runtimes or flags or program.sched):
            return
        bcc = load_bcc()
        try:
            # The probe points are read from the runtimes' files while clang compiles (the compile
            # is a ctypes call, outside the GIL).
            runtimes = program.runtimes
            with ThreadPoolExecutor(max(1, min(4, len(runtimes)))) as pool:
                found = [pool.submit(find_probes, i, r) for i, r in enumerate(runtimes)]
                bpf = bcc.BPF(text=program.source(), cflags=flags)
                probes = [p for p in (f.result() for f in found) if p is not None]
            self._bpf.append(bpf)
            self._process = bpf
            self._regions = BccRegionProbes(bpf, program.tgid)
            if program.sched is not None:
                # TRACEPOINT_PROBE functions are attached as the program loads.
                self._sched_bpf = bpf
                self._seed_threads(bpf, program.tgid)
                self.attached += [
                    "tracepoint:sched:sched_switch",
                    "tracepoint:sched:sched_wakeup",
                    "tracepoint:sched:sched_wakeup_new",
                ]
            if flags:
                if sample:
                    self._attach_sampler(bcc, bpf)
                assert self.walker is not None
                self.walker.attach(bpf)
            for copy in probes:
                self._attach_regions(copy)
        except Exception:
            self.cleanup(wait=True)
            raise

    def _attach_sampler(self, bcc: ModuleType, bpf: BpfProgram) -> None:
        """The walker's on-CPU sampler: a cpu-clock event on every CPU, kept to the target's
        threads by the program (with native stacks, at perf record's rate, where it samples
        them instead of perf)."""
        if self._native and self._context is not None:
            self._sample_hz = self._context.options.perf_rate_hz
        bpf.attach_perf_event(
            ev_type=bcc.PerfType.SOFTWARE,
            ev_config=bcc.PerfSWConfig.CPU_CLOCK,
            fn_name="on_cpu_sample",
            sample_freq=self._sample_hz,
        )
        self._sampling = True
        what = "Python and native stacks" if self._native else "Python stacks"
        self.attached.append(f"perf_event:cpu-clock@{self._sample_hz}Hz ({what})")
        if self._dispatch_wakeups:
            # Attached as the program loaded: who wakes the pool's workers, for their samples.
            self.attached.append("tracepoint:sched:sched_waking (dispatchers)")

    def _attach_regions(self, copy: RuntimeProbes) -> None:
        """One runtime copy's entry and end probes; a copy that refuses them is left out with
        a warning, the rest go on."""
        assert self._regions is not None
        probes = region_uprobes(copy)
        try:
            self._regions.attach(probes)
        except Exception as exc:  # a stripped or unusual runtime: the rest still works
            self.warnings.append(f"region probes in {copy.runtime.path} failed: {exc}")
            return
        if any(p.retprobe for p in probes):
            self.warnings.append(
                f"the returns of {', '.join(e.symbol for e in copy.entries)} in "
                f"{copy.runtime.path} could not be found (pyelftools/capstone unavailable or an "
                "indirect jump): region ends come from a uretprobe, which makes py-spy "
                "--native's pauses longer"
            )
        self._region_probes += probes
        self.attached += [p.described for p in probes]
        self._hit_s[copy.index] = copy.hit_cost_s()
        self.probed_runtimes.append(copy.describe())

    def _entries_by_copy(self) -> dict[int, int]:
        if self._process is None:
            return {}
        table = self._process["runtime_entries"]
        return {index: int(table[ctypes.c_int(index)].value) for index in self._hit_s}

    def entries_by_copy(self) -> dict[int, int]:
        """Regions entered so far, by probed runtime copy (its index)."""
        return self._entries_by_copy()

    def region_count(self, before: dict[int, int], elapsed_s: float) -> RegionCount:
        """Regions a second since `before` (entries_by_copy() then), and what their probes
        cost the dispatching threads: each copy's trap cost and the walker's, in place."""
        walk_s = WALKER_HIT_S if self.walker is not None and self.walker.layout else 0.0
        elapsed_s = max(1e-9, elapsed_s)
        rates = {i: (n - before.get(i, 0)) / elapsed_s for i, n in self._entries_by_copy().items()}
        cost = IN_PLACE * sum(r * (self._hit_s[i] + walk_s) for i, r in rates.items())
        return RegionCount(sum(rates.values()), cost)

    def attach_region_probes(self, entries: bool) -> None:
        """The entry probes (True) or the end probes (False) on again (DutyCycle's attach)."""
        self._attach_probes(entries)

    def detach_region_probes(self, entries: bool) -> None:
        """The entry probes (True) or the end probes (False) off (DutyCycle's detach)."""
        self._detach_probes(entries)

    def _judge_region_rate(
        self, context: CaptureContext, start: int, before: dict[int, int], seconds: float = 0.3
    ) -> None:
        """Count each copy's regions for a moment since the probes went on (start, before);
        detach them when their traps would cost the dispatching threads more than their share
        of the budget (a loop of small parallel ops can start 100 000 regions a second: 2 us
        each is then 20% of its time)."""
        if self._process is None:
            return
        walk_s = WALKER_HIT_S if self.walker is not None and self.walker.layout else 0.0

        def counted(since: int, before: dict[int, int], seconds: float) -> RegionCount:
            """Regions a second and their expected cost to the dispatching threads."""
            remaining = seconds - (context.clock() - since) / 1e9
            if remaining > 0:
                time.sleep(remaining)
            return self.region_count(before, (context.clock() - since) / 1e9)

        first = counted(start, before, seconds)
        pyspy = "pyspy" in context.collectors
        budget = REGION_PROBE_PART * context.options.budget.fraction
        walker = self.walker is not None and self.walker.layout is not None
        # The check ran while the other tools started, and can count fewer regions than the
        # window sees: near the part, it counts again, and judges by the higher rate.
        again = (
            counted(context.clock(), self._entries_by_copy(), RECOUNT_S)
            if needs_recount(first, budget, walker, pyspy)
            else None
        )
        decision = decide_regions(
            first,
            again,
            budget,
            IN_PLACE * (max(self._hit_s.values(), default=0.0) + walk_s),
            walker=walker,
            pyspy=pyspy,
            sampling=self._sampling,
        )
        self.region_outcome = RegionOutcome(decision, decision.reason)
        if decision.action == "keep":
            return
        if decision.action == "detach":
            self._detach_regions(decision.reason)
            return
        self.warnings.append(decision.reason)
        self._cycle = DutyCycle(
            decision.duty,
            context.clock,
            self._attach_probes,
            self._detach_probes,
            window_s=context.duration_s,
            entries=lambda: sum(self._entries_by_copy().values()),
            cost_s=decision.cost_per_region_s,
            budget=budget,
        )
        self._cycle.start(decision.recounted_per_s)
        self.region_outcome = replace(
            self.region_outcome, recounted_per_s=self._cycle.recounted_per_s
        )

    def _detach_regions(self, reason: str) -> None:
        self.region_outcome = replace(self.region_outcome, reason=reason)
        self.warnings.append(reason)
        # Only the region probes go: the walker's sampler stays on the same program.
        with contextlib.suppress(Exception):
            self._detach_probes(True)
            self._detach_probes(False)
        self._region_probes = []
        self.regions_detached = True
        self.attached = [a for a in self.attached if not a.startswith(("uprobe:", "uretprobe:"))]

    def _attach_probes(self, entries: bool) -> None:
        assert self._regions is not None
        self._regions.attach([p for p in self._region_probes if p.entry == entries])

    def _detach_probes(self, entries: bool) -> None:
        if self._regions is not None:
            self._regions.detach(entries)

    def _stop_cycle(self) -> None:
        """The on-times into the decision, once the switching has stopped."""
        if self._cycle is None:
            return
        cycle, self._cycle = self._cycle, None
        on_ns = cycle.stop()
        self._on_ns = list(on_ns)
        self.region_outcome = replace(
            self.region_outcome,
            duty=cycle.duty,  # the last, from the window's rate
            on_ns=tuple((start, end) for start, end in on_ns),
            probed_s=cycle.probed_s,
        )
        if cycle.error:
            self.warnings.append(cycle.error)

    def _seed_threads(self, bpf: BpfProgram | CoreObject, pid: int) -> None:
        times = bpf["times"]
        for tid in procfs.list_tids(pid):
            times[times.Key(tid)] = times.Leaf()

    def progress(self) -> int:
        if self._process is None:
            return 0
        try:
            return int(self._process["region_count"][ctypes.c_int(0)].value)
        except Exception:
            return 0

    def stop(self) -> CollectorResult:
        assert self._context is not None
        self._judged.wait(timeout=5)  # a window cut short by a signal may end before the check
        self._stop_cycle()
        end_ns = self._context.clock()
        # The region counters while every probe is still on: the links close in any order, and
        # regions entered after an end probe went but before its entry probe did would read as
        # regions without an end. The log is read up to this count of ended regions.
        counts = unseen_ends(self._process) if self._process is not None else None
        if self._core is not None:
            # Every probe off as the window ends; the kernel's waits for their closes overlap
            # the reading below and the report (the maps stay readable).
            self._core.detach(wait=False)
        payload: dict[str, object] = {"threads": {}, "wakeups": [], "histogram_us_log2": {}}
        # Off-CPU time per (Python stack, thread), the intervals still open at the window's
        # end closed there, as the threads' on/off-CPU times are.
        offcpu_by_stack: dict[tuple[int, int], list[int]] = {}
        if self._sched_bpf is not None:
            sched = read_sched(self._sched_bpf, end_ns, self.lost)
            payload["threads"], payload["wakeups"] = sched.threads, sched.wakeups
            self.slices, offcpu_by_stack = sched.slices, sched.offcpu_by_stack
        python: dict[str, object] = {"walker": "off", "reason": "no OpenMP region probe"}
        native_notes: dict[str, object] = {}
        if self.walker is not None:
            python["reason"] = self.walker.reason
        if self._process is not None:
            process = self._process
            assert counts is not None
            entries, ended, missed = counts
            # Not after the probes were detached: regions in flight then lose their ends, and
            # the log is not read.
            if not self.regions_detached and missed > max(5, entries // 100):
                self.warnings.append(
                    f"{missed} of {entries} OpenMP regions ended where the end probe did not "
                    "see them: region times are incomplete"
                )
            stack_index: dict[int, int] = {}
            if self.walker is not None and self.walker.layout is not None:
                python, stack_index = self.walker.read()
            if not self.regions_detached:
                found = read_regions(process, ended, stack_index, self._on_ns, self.lost)
                self.regions = found.columns
                if self._on_ns:
                    self.region_outcome = replace(
                        self.region_outcome,
                        regions_before_on_times=found.before_on_times,
                        regions_after_on_times=found.after_on_times,
                    )
            if self._sampling:
                native_notes = self._take_samples(process, python, stack_index)
            if self._sched_bpf is not None and stack_index:
                python["offcpu"] = {
                    "tid": [tid for (_, tid) in offcpu_by_stack],
                    "stack": [stack_index.get(stack, -1) for (stack, _) in offcpu_by_stack],
                    "ns": [v[0] for v in offcpu_by_stack.values()],
                    "switches": [v[1] for v in offcpu_by_stack.values()],
                }
            payload["region_entries"] = entries
            hist = process["duration_us_log2"]
            payload["histogram_us_log2"] = {
                str(k.value): v.value for k, v in hist.items() if v.value
            }
        self.cleanup()
        return self._finish(payload, end_ns, native_notes, python)

    def _take_samples(
        self, bpf: BpfProgram, python: dict[str, object], stack_index: dict[int, int]
    ) -> dict[str, object]:
        """The sampler's logs into the walker's part of ebpf.json, and native.json where it
        took native stacks; the notes on them for the manifest."""
        assert self._context is not None
        samples = read_samples(bpf, stack_index, self._sample_hz)
        python["samples"], python["dispatched"] = samples.python, samples.dispatched
        self.lost["python_samples"] = samples.lost
        if not self._native:
            return {}
        native = self._native_tables(bpf, samples)
        write_new(self._context.directory / NATIVE, json.dumps(native))
        return {
            "native_samples": len(native["samples"]["t_ns"]),
            "native_stacks_lost": native["lost"],
            "native_rate_hz": self._sample_hz,
        }

    def _finish(
        self,
        payload: dict[str, object],
        end_ns: int,
        native_notes: dict[str, object],
        python: dict[str, object],
    ) -> CollectorResult:
        """ebpf.json written, whichever loader ran; the collector's result."""
        assert self._context is not None
        payload.update(
            {
                "slices": self.slices,
                "regions": self.regions,
                "python": python,
                "lost": self.lost,
                "attached": self.attached,
                "warnings": self.warnings,
                "sched": self.sched_decision.as_record() if self.sched_decision else {},
                "regions_decision": self.region_outcome.as_record(),
                "window": {"start_ns": self._start_ns, "end_ns": end_ns},
                "runtime": (
                    self._context.target.openmp_runtime.path
                    if self._context.target.openmp_runtime
                    else None
                ),
                # Every runtime copy whose region probes went on; regions.runtime indexes it.
                "runtimes": self.probed_runtimes,
                "loader": self.loader_record(),
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
                "loader": self.loader_record(),
            },
        )

    def _native_tables(self, bpf: BpfProgram, samples: SampleTables) -> dict[str, Any]:
        """Every thread's native stacks, where the sampler took them, as perf.json's tables."""
        assert self._context is not None
        pid = self._context.target.pid
        # Imported here: it brings numpy, a tenth of a second start-up need not wait for.
        from ...host.symbols import ProcessSymbols

        # Without bcc, its symbol cache is not there either.
        names = ProcessSymbols(pid) if self.loader == "core" else None
        try:
            native = native_tables(
                [(int(v.t_ns), int(v.tid), int(v.native)) for _, v in samples.rows],
                read_stacks(bpf["native_stacks"]),
                pid,
                round(1e9 / self._sample_hz),
                names,
            )
        finally:
            if names is not None:
                names.close()
        # Samples whose stack did not fit the full map, and those past the log.
        native["lost"] += int(bpf["native_counts"][ctypes.c_int(0)].value) + samples.lost
        return native

    def cleanup(self, wait: bool = False) -> None:
        """Detach every probe; safe to call more than once. The CO-RE object's links close on a
        thread of their own unless `wait`: the probes stop as their closes begin, and the
        kernel's grace periods after that need not hold up the report (libbpf.py)."""
        self._judged.wait(timeout=5)  # the rate check reads and detaches the region probes
        self._stop_cycle()
        if self.walker is not None:
            self.walker.halt()
        self._sched_bpf = self._process = None
        if self._core is not None:
            self._core.close(wait=wait)  # its links at once, region probes included
            self._core = None
        while self._bpf:
            bpf = self._bpf.pop()
            with contextlib.suppress(Exception):
                detach_uprobes(bpf)
            with contextlib.suppress(Exception):
                bpf.cleanup()
