"""The eBPF collector: scheduler slices, wakeups, OpenMP parallel regions and on-CPU samples
of the target, with their Python stacks.

It decides and orders; the parts do the work. The process program is loaded through either
loader behind one interface (loading.py: the prebuilt CO-RE object through libbpf wherever it
loads, else bcc's compile); its region probes are switched through one interface for both
(region_probes.py); their rate decides whether they stay on (region_policy.py, duty.py); the
window's maps are read into ebpf.json's tables after it (reader.py, logs.py). Probes are
attached for the target only, and detached on every exit path (cleanup()).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ...bundle.parts import EBPF, NATIVE, CollectorResult
from ...bundle.safefile import write_new
from ...host.mapped import UnverifiedFile
from ...host.target import Runtime, Target
from ..budget import REGION_PROBE_PART
from ..collectors.base import Availability, CaptureContext
from . import libbpf
from .duty import RECOUNT_S, DutyCycle
from .loader import BccUnavailable, BpfProgram, load_bcc
from .loading import Loaded, LoaderName, LoadRequest, load, loader_record
from .logs import region_columns, sampled_count, slice_columns, unseen_ends
from .native import NATIVE_STACK_ENTRIES
from .programs import PYTHON_SAMPLE_HZ
from .pywalk import PythonWalker
from .reader import ReadPlan, read_tables
from .region_policy import RegionCount, RegionOutcome, decide_regions, needs_recount
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
        # The target's process program, through whichever loader (loading.py).
        self._loaded: Loaded | None = None
        self.sched_decision: SchedDecision | None = None
        self._on_ns: list[tuple[int, int]] = []  # the switched probes' on-times
        self.region_outcome = RegionOutcome()
        self._context: CaptureContext | None = None
        self.slices = slice_columns()
        self.regions = region_columns()
        self.walker: PythonWalker | None = None
        self._region_probes: list[Uprobe] = []
        self._hit_s: dict[int, float] = {}  # each probed copy's trap cost per region
        self.probed_runtimes: list[dict[str, object]] = []
        self.regions_detached = False
        self._cycle: DutyCycle | None = None  # set when the probes are switched on and off
        # The region-rate check runs while the other tools settle; the window waits for it.
        self._judged = threading.Event()
        self._judged.set()
        self.loader: LoaderName = "bcc"
        self.loader_reason = ""  # why this loader ran, for the manifest and the report
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

    def _choose_loader(self, asked: str) -> LoaderName:
        """The asked loader or, for auto, the prebuilt CO-RE object wherever the kernel has BTF
        and libbpf loads (nothing compiled: a shorter start), else bcc."""
        if asked != "auto":
            self.loader_reason = f"asked for (--ebpf-loader {asked})"
            return "core" if asked == "core" else "bcc"
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
                self._load(context)
            except libbpf.CoreUnavailable as exc:
                if asked != "auto" or not _bcc_loads():
                    raise
                # A kernel that refuses the prebuilt object (an old one without attach
                # cookies) may still take what bcc compiles for it.
                self._reset_for_bcc(f"eBPF through bcc: the prebuilt CO-RE program failed: {exc}")
                self._load(context)
        else:
            self._load(context)
        if self._region_probes:
            self._judged.clear()
            threading.Thread(
                target=self._judge_in_background,
                args=(context, context.clock(), self._entries_by_copy()),
                name="profkit-region-rate",
                daemon=True,
            ).start()
        self._start_ns = context.clock()

    def _load(self, context: CaptureContext) -> None:
        """The process program for this capture: the sampler and walker, the region probes of
        every runtime copy, the scheduler tracepoints where they fit the budget."""
        target = context.target
        switches = SwitchRate(context.clock)
        runtimes = tuple(probeable(target.runtimes))
        # The probe points are found (disassembly), the walker prepared, the switch rate counted
        # and the program loaded side by side: each takes a fraction of a second. The
        # tracepoints are part of the one program, so their decision comes before the load.
        with ThreadPoolExecutor(max(1, min(4, len(runtimes)))) as pool:
            found = [pool.submit(self._find_probes, i, r) for i, r in enumerate(runtimes)]
            flags = self._prepare_walker(target, context.options.python_stacks != "off")
            self.sched_decision = decide_sched(context, switches)
            if not self.sched_decision.traced:
                self.warnings.append(self.sched_decision.reason)
            # Native stacks come from the walker's sampler unless perf record samples them in
            # this capture, or DWARF call graphs were asked for (only perf unwinds those).
            self._native = (
                bool(flags)
                and "perf_record" not in context.collectors
                and context.options.perf_callgraph == "fp"
            )
            if self._native:
                self._sample_hz = context.options.perf_rate_hz
            request = LoadRequest(
                pid=target.pid,
                runtimes=runtimes,
                walker=self.walker if flags else None,
                walker_flags=tuple(flags),
                sched=self.sched_decision.traced,
                sample_hz=self._sample_hz,
                native=self._native,
                native_stacks=NATIVE_STACK_ENTRIES if self._native else 0,
                print_source=self.print_programs,
            )
            self._loaded = load(self.loader, request, found)
        self._attach_found()

    def _find_probes(self, index: int, runtime: Runtime) -> RuntimeProbes | None:
        """One copy's probe points; a copy that cannot be read as the target maps it is left
        out with a note naming only the target's own name for it."""
        try:
            return find_probes(index, runtime)
        except UnverifiedFile as exc:
            self.warnings.append(f"no region probes: {exc}")
            return None

    def _attach_found(self) -> None:
        """What the load attached into the record, then every copy's region probes."""
        if self._loaded is None:
            return
        self.attached += self._loaded.attached
        try:
            for copy in self._loaded.probes:
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
        if self._loaded is not None:
            return self._loaded.record(self.loader_reason)
        return loader_record(self.loader, self.loader_reason)

    def _reset_for_bcc(self, why: str) -> None:
        # bcc's uprobes cannot share an instruction with libbpf's (docs/install.md): gone first.
        self.cleanup(wait=True)
        self.loader = "bcc"
        self.loader_reason = f"auto: {why.removeprefix('eBPF through bcc: ')}"
        self.warnings = [why]
        self.attached = []
        self.sched_decision = None
        self._region_probes, self._hit_s, self.probed_runtimes = [], {}, []

    def load_counters(
        self, target: Target, python_stacks: bool = True, loader: str = "auto"
    ) -> None:
        """For a long-running reader (profkit watch): the walker and every runtime copy's
        region probes with no logs, no sampler and no scheduler tracepoints; the cumulative maps
        (pystack_stats, runtime_entries) are read as often as wanted, and cleanup() detaches."""
        flags = self._prepare_walker(target, python_stacks)
        self.loader = self._choose_loader(loader)
        runtimes = tuple(probeable(target.runtimes))
        request = LoadRequest(
            pid=target.pid,
            runtimes=runtimes,
            walker=self.walker if flags else None,
            walker_flags=tuple(flags),
            sched=False,
            sample_hz=0,
            native=False,
            native_stacks=0,
            logs=False,
            print_source=self.print_programs,
        )
        with ThreadPoolExecutor(max(1, min(4, len(runtimes)))) as pool:
            found = [pool.submit(self._find_probes, i, r) for i, r in enumerate(runtimes)]
            self._loaded = load(self.loader, request, found)
        self._attach_found()

    @property
    def program(self) -> BpfProgram | None:
        """The target's loaded process program (bcc's or the CO-RE object), for a reader of
        its counters (profkit watch); None before load and after cleanup."""
        return self._process

    @property
    def _process(self) -> BpfProgram | None:
        return self._loaded.program if self._loaded is not None else None

    @property
    def _sched_bpf(self) -> BpfProgram | None:
        loaded = self._loaded
        return loaded.program if loaded is not None and loaded.sched else None

    @property
    def _sampling(self) -> bool:
        return self._loaded is not None and self._loaded.sampling

    def _prepare_walker(self, target: Target, wanted: bool) -> list[str]:
        self.walker = PythonWalker(target.pid)
        flags = self.walker.prepare() if wanted else []
        if not flags:
            self.walker.reason = self.walker.reason or "Python stack walker off (--python-stacks)"
            self.warnings.append(self.walker.reason)
        return flags

    def _attach_regions(self, copy: RuntimeProbes) -> None:
        """One runtime copy's entry and end probes; a copy that refuses them is left out with
        a warning, the rest go on."""
        assert self._loaded is not None
        probes = region_uprobes(copy)
        try:
            self._loaded.regions.attach(probes)
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
        assert self._loaded is not None
        self._loaded.regions.attach([p for p in self._region_probes if p.entry == entries])

    def _detach_probes(self, entries: bool) -> None:
        if self._loaded is not None:
            self._loaded.regions.detach(entries)

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
        if self._loaded is not None:
            # Every probe off as the window ends; the kernel's waits for their closes overlap
            # the reading below and the report (the maps stay readable).
            self._loaded.detach()
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
        )
        loader = self.loader_record()  # before cleanup() lets the program go
        try:
            tables = read_tables(self._process, self._sched_bpf, self.walker, plan, self.lost)
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
        if self._on_ns:
            self.region_outcome = replace(
                self.region_outcome,
                regions_before_on_times=tables.regions_before_on_times,
                regions_after_on_times=tables.regions_after_on_times,
            )
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
        return self._finish(payload, end_ns, native_notes, tables.python, loader)

    def _finish(
        self,
        payload: dict[str, object],
        end_ns: int,
        native_notes: dict[str, object],
        python: dict[str, object],
        loader: dict[str, object],
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
        kernel's grace periods after that need not hold up the report (libbpf.py)."""
        self._judged.wait(timeout=5)  # the rate check reads and detaches the region probes
        self._stop_cycle()
        if self.walker is not None:
            self.walker.halt()
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            loaded.close(wait=wait)  # every probe at once, region probes included
