"""The eBPF collector: scheduler slices, wakeups, OpenMP parallel regions and on-CPU samples
of the target, with their Python stacks.

bcc compiles the programs (programs.py renders them for one target) where it loads; elsewhere
the prebuilt CO-RE sampler loads through libbpf (core_sampler.py). Probes are attached for the
target only, and detached on every exit path (cleanup()). The region probes' rate decides
whether they stay on (region_policy.py); the logs are read after the window (logs.py).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

from ...bundle.parts import EBPF, NATIVE, CollectorResult
from ...bundle.safefile import write_new
from ...host import procfs
from ...host.symbols import ProcessSymbols
from ...host.target import Target
from ..budget import REGION_PROBE_SHARE
from ..collectors.base import Availability, CaptureContext
from . import libbpf
from .core_sampler import load_sampler
from .duty import RECOUNT_S, DutyCycle
from .libbpf import CoreObject
from .loader import BccUnavailable, BpfProgram, detach_uprobes, load_bcc
from .logs import entry_count, read_log, sampled_count
from .native import NATIVE_STACK_ENTRIES, native_tables, read_stacks
from .programs import PYTHON_SAMPLE_HZ, OpenMPProgram, SchedProgram
from .pywalk import PythonWalker
from .region_policy import RegionCount, decide_regions, needs_recount
from .regions import RuntimeProbes, find_probes, probeable
from .scheduler import SwitchRate, decide_sched

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


class EbpfCollector:
    name = "ebpf"

    def __init__(self, print_programs: bool = False) -> None:
        self.print_programs = print_programs
        self._bpf: list[BpfProgram] = []  # every loaded program, for cleanup
        self._sched_bpf: BpfProgram | None = None
        self._openmp_bpf: BpfProgram | None = None
        self.sched_decision: dict[str, object] = {}
        self._on_ns: list[tuple[int, int]] = []  # the switched probes' on-times
        self.region_decision: dict[str, object] = {}
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
            "runtime": [],  # index into the probed runtimes
            "stack": [],  # index into the walker's stacks, -1 for none
        }
        self.walker: PythonWalker | None = None
        self._region_probes: list[tuple[str, dict[str, object]]] = []
        self._hit_s: dict[int, float] = {}  # each probed copy's trap cost per region
        self.probed_runtimes: list[dict[str, object]] = []
        self.regions_detached = False
        self._cycle: DutyCycle | None = None  # set when the probes are switched on and off
        # bcc's names of the attached entry (True) and end (False) probes' events
        self._events: dict[bool, set[bytes]] = {}
        # The region-rate check runs while the other tools settle; the window waits for it.
        self._judged = threading.Event()
        self._judged.set()
        self._sampling = False
        self._dispatch_wakeups = False
        self.loader = "bcc"
        self._core: CoreObject | None = None  # the CO-RE sampler, where it runs instead of bcc
        self._native = False
        self._sample_hz = PYTHON_SAMPLE_HZ
        self.lost = {"slices": 0, "regions": 0}
        self.attached: list[str] = []
        self.warnings: list[str] = []
        self._start_ns = 0

    def available(self, target: Target) -> Availability:
        try:
            load_bcc()
        except BccUnavailable as exc:
            core = libbpf.readiness()
            if core:
                return Availability(False, f"{exc}; and CO-RE cannot load: {core}")
        return Availability(True)

    def _choose_loader(self, asked: str) -> str:
        """bcc where asked or, for auto, where it loads; else the prebuilt CO-RE objects."""
        if asked != "auto":
            return asked
        try:
            load_bcc()
        except BccUnavailable as exc:
            self.warnings.append(
                f"eBPF through the prebuilt CO-RE sampler ({exc}): no region probes or "
                "scheduler tracepoints yet"
            )
            return "core"
        return "bcc"

    def start(self, context: CaptureContext) -> None:
        self._context = context
        self.loader = self._choose_loader(context.options.ebpf_loader)
        if self.loader == "core":
            self._start_core(context)
            return
        target = context.target
        switches = SwitchRate(context.clock)
        flags = self._prepare_walker(target, context.options.python_stacks != "off")
        # Decided before compiling, since the tracepoints are part of the one program: the
        # context-switch rate is counted over the walker's preparation.
        self.sched_decision = decide_sched(context, switches)
        traced = bool(self.sched_decision["traced"])
        if not traced:
            self.warnings.append(str(self.sched_decision["reason"]))
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
        if self._region_probes:
            self._judged.clear()
            threading.Thread(
                target=self._judge_in_background,
                args=(context, context.clock(), self._entries_by_copy()),
                name="profkit-region-rate",
                daemon=True,
            ).start()
        self._start_ns = context.clock()

    def _start_core(self, context: CaptureContext) -> None:
        """The prebuilt sampler and walker through libbpf: Python and native stacks of every
        target thread, a worker's with its dispatcher's Python stack. No region probes or
        scheduler tracepoints: those are bcc's programs still."""
        target = context.target
        flags = self._prepare_walker(target, context.options.python_stacks != "off")
        if not flags or self.walker is None or self.walker.layout is None:
            raise libbpf.CoreUnavailable(
                self.walker.reason if self.walker else "no Python stack walker"
            )
        # The wakeup tracepoint that finds a worker's dispatcher runs on every wakeup of the
        # machine: it follows the scheduler decision's cost check.
        decided = decide_sched(context)
        wakeups = bool(decided["traced"])
        not_yet = "not in the CO-RE programs yet (--ebpf-loader bcc has them)"
        self.sched_decision = {
            **decided,
            "traced": False,
            "reason": f"scheduler tracepoints {not_yet}",
        }
        self.region_decision = {
            "traced": False,
            "reason": f"OpenMP region probes {not_yet}; the pool's call sites come from its "
            "workers' samples",
        }
        self._native = (
            "perf_record" not in context.collectors and context.options.perf_callgraph == "fp"
        )
        if self._native:
            self._sample_hz = context.options.perf_rate_hz
        program = OpenMPProgram(
            tgid=target.pid, native_stacks=NATIVE_STACK_ENTRIES if self._native else 0
        )
        core = load_sampler(
            target.pid, self.walker.layout, program.sample_capacity, program.native_stacks
        )
        self._core = core
        try:
            core.attach_cpu_clock("on_cpu_sample", self._sample_hz)
            what = "Python and native stacks" if self._native else "Python stacks"
            self.attached.append(f"perf_event:cpu-clock@{self._sample_hz}Hz ({what}, CO-RE)")
            if wakeups:
                try:
                    core.attach("on_waking")
                    self.attached.append("tp_btf:sched_waking (dispatchers, CO-RE)")
                except libbpf.CoreUnavailable as exc:
                    # Workers are then placed under the only Python thread, where there is one.
                    self.warnings.append(f"wakeups not traced, dispatchers by thread count: {exc}")
            self._sampling = True
            self.walker.attach(core)
        except Exception:
            self.cleanup()
            raise
        self._start_ns = context.clock()

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

    def load_counters(self, target: Target, python_stacks: bool = True) -> None:
        """For a long-running reader (profkit watch): the walker and every runtime copy's
        region probes with no logs, no sampler and no scheduler tracepoints; the cumulative maps
        (pystack_stats, runtime_entries) are read as often as wanted, and cleanup() detaches."""
        flags = self._prepare_walker(target, python_stacks)
        program = OpenMPProgram(
            tuple(probeable(target.runtimes)), target.pid, region_capacity=1, sample_capacity=1
        )
        self._load(program, flags, sample=False)

    @property
    def program(self) -> BpfProgram | None:
        """The target's loaded process program (bcc's or the CO-RE object), for a reader of
        its counters (profkit watch); None before load and after cleanup."""
        return self._openmp_bpf if self._openmp_bpf is not None else self._core

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
            self._openmp_bpf = bpf
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
                self._attach_regions(copy, program.tgid)
        except Exception:
            self.cleanup()
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

    def _attach_regions(self, copy: RuntimeProbes, pid: int) -> None:
        """One runtime copy's entry and end probes; a copy that refuses them is left out with
        a warning, the rest go on."""
        assert self._openmp_bpf is not None
        bpf, path = self._openmp_bpf, copy.runtime.path
        added: list[tuple[str, dict[str, object]]] = []
        described: list[str] = []

        def probe(kind: str, what: str, **where: object) -> None:
            before = set(bpf.uprobe_fds)
            getattr(bpf, f"attach_{kind}")(name=path, pid=pid, **where)
            entry = where["fn_name"] != "on_region_return"
            self._events.setdefault(entry, set()).update(set(bpf.uprobe_fds) - before)
            added.append((kind, {"name": path, "pid": pid, **where}))
            described.append(f"{kind}:{path}:{what}")

        try:
            # The ends first, as the duty cycle attaches them: a region entered between an
            # entry probe and its end probe would never be seen to end.
            if copy.end is not None:
                what = f"{copy.end.address:#x} (region end, after the team barrier)"
                probe("uprobe", what, addr=copy.end.address, fn_name="on_region_return")
            elif copy.returns:
                # A uprobe on each `ret` rather than a uretprobe: see returns.py.
                for address in copy.returns:
                    probe(
                        "uprobe", f"{address:#x} (return)", addr=address, fn_name="on_region_return"
                    )
            else:
                for entry in copy.entries:
                    probe("uretprobe", entry.symbol, sym=entry.symbol, fn_name="on_region_return")
                self.warnings.append(
                    f"the returns of {', '.join(e.symbol for e in copy.entries)} in {path} could "
                    "not be found (pyelftools/capstone unavailable or an indirect jump): region "
                    "ends come from a uretprobe, which makes py-spy --native's pauses longer"
                )
            for entry in copy.entries:
                if entry.point is not None:
                    what = f"{entry.address:#x} ({entry.symbol} entry, {entry.point.instruction})"
                    probe("uprobe", what, addr=entry.address, fn_name=copy.handler)
                else:
                    probe("uprobe", entry.symbol, sym=entry.symbol, fn_name=copy.handler)
        except Exception as exc:  # a stripped or unusual runtime: the rest still works
            for kind, where in added:
                with contextlib.suppress(Exception):
                    getattr(bpf, f"detach_{kind}")(
                        **{k: v for k, v in where.items() if k != "fn_name"}
                    )
            self.warnings.append(f"region probes in {path} failed: {exc}")
            return
        self._region_probes += added
        self.attached += described
        self._hit_s[copy.index] = copy.hit_cost_s()
        self.probed_runtimes.append(copy.describe())

    def _entries_by_copy(self) -> dict[int, int]:
        if self._openmp_bpf is None:
            return {}
        table = self._openmp_bpf["runtime_entries"]
        return {index: int(table[ctypes.c_int(index)].value) for index in self._hit_s}

    def _judge_region_rate(
        self, context: CaptureContext, start: int, before: dict[int, int], seconds: float = 0.3
    ) -> None:
        """Count each copy's regions for a moment since the probes went on (start, before);
        detach them when their traps would cost the dispatching threads more than their share
        of the budget (a loop of small parallel ops can start 100 000 regions a second: 2 us
        each is then 20% of its time)."""
        bpf = self._openmp_bpf
        if bpf is None:
            return
        walk_s = WALKER_HIT_S if self.walker is not None and self.walker.layout else 0.0

        def counted(since: int, before: dict[int, int], seconds: float) -> RegionCount:
            """Regions a second and their expected share of the dispatching threads."""
            remaining = seconds - (context.clock() - since) / 1e9
            if remaining > 0:
                time.sleep(remaining)
            elapsed_s = max(1e-9, (context.clock() - since) / 1e9)
            rates = {
                i: (n - before.get(i, 0)) / elapsed_s for i, n in self._entries_by_copy().items()
            }
            share = IN_PLACE * sum(r * (self._hit_s[i] + walk_s) for i, r in rates.items())
            return RegionCount(sum(rates.values()), share)

        first = counted(start, before, seconds)
        pyspy = "pyspy" in context.collectors
        budget = REGION_PROBE_SHARE * context.options.budget.overhead_share
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
        self.region_decision = decision.as_record()
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
        self.region_decision["regions_per_s_recounted"] = round(self._cycle.recounted_per_s)

    def _detach_regions(self, reason: str) -> None:
        self.region_decision["reason"] = reason
        self.warnings.append(reason)
        # Only the region probes go: the walker's sampler stays on the same program.
        with contextlib.suppress(Exception):
            self._detach_probes(True)
            self._detach_probes(False)
        self._region_probes = []
        self.regions_detached = True
        self.attached = [a for a in self.attached if not a.startswith(("uprobe:", "uretprobe:"))]

    def _probes(self, entries: bool) -> list[tuple[str, dict[str, object]]]:
        ends = [p for p in self._region_probes if p[1]["fn_name"] == "on_region_return"]
        return [p for p in self._region_probes if p not in ends] if entries else ends

    def _attach_probes(self, entries: bool) -> None:
        bpf = self._openmp_bpf
        assert bpf is not None
        before = set(bpf.uprobe_fds)
        for kind, where in self._probes(entries):
            getattr(bpf, f"attach_{kind}")(**where)
        self._events[entries] = set(bpf.uprobe_fds) - before

    def _detach_probes(self, entries: bool) -> None:
        """All at once: one after another, each close waits for the kernel (loader.py)."""
        if self._openmp_bpf is not None:
            detach_uprobes(self._openmp_bpf, self._events.pop(entries, set()))

    def _stop_cycle(self) -> None:
        """The on-times into the decision, once the switching has stopped."""
        if self._cycle is None:
            return
        cycle, self._cycle = self._cycle, None
        on_ns = cycle.stop()
        self._on_ns = list(on_ns)
        self.region_decision["duty"] = round(cycle.duty, 3)  # the last, from the window's rate
        self.region_decision["on_ns"] = [list(interval) for interval in on_ns]
        self.region_decision["probed_s"] = round(cycle.probed_s, 3)
        if cycle.error:
            self.warnings.append(cycle.error)

    def _seed_threads(self, bpf: BpfProgram, pid: int) -> None:
        times = bpf["times"]
        for tid in procfs.list_tids(pid):
            times[times.Key(tid)] = times.Leaf()

    def progress(self) -> int:
        if self._openmp_bpf is None:
            return 0
        try:
            return int(self._openmp_bpf["region_count"][ctypes.c_int(0)].value)
        except Exception:
            return 0

    def stop(self) -> CollectorResult:
        assert self._context is not None
        if self._core is not None:
            return self._stop_core()
        self._judged.wait(timeout=5)  # a window cut short by a signal may end before the check
        self._stop_cycle()
        end_ns = self._context.clock()
        payload: dict[str, object] = {"threads": {}, "wakeups": [], "histogram_us_log2": {}}
        # Off-CPU time per (Python stack, thread); the intervals still open at the window's end
        # are closed here, as the threads' on/off-CPU times are.
        offcpu_by_stack: dict[tuple[int, int], list[int]] = {}
        if self._sched_bpf is not None:
            sched = self._sched_bpf
            threads = {}
            for key, value in sched["times"].items():
                oncpu, offcpu = value.oncpu_ns, value.offcpu_ns
                # Close the interval each thread is in at the end of the window.
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
            payload["threads"] = threads
            self._read_slices(sched)
            for k, v in sched["pystack_offcpu"].items():
                off = offcpu_by_stack.setdefault((k.stack, k.tid), [0, 0])
                off[0] += int(v.ns)
                off[1] += int(v.switches)
            payload["wakeups"] = [[k.waker, k.wakee, v.value] for k, v in sched["wakeups"].items()]
        python: dict[str, object] = {"walker": "off", "reason": "no OpenMP region probe"}
        native_notes: dict[str, object] = {}
        if self.walker is not None:
            python["reason"] = self.walker.reason
        if self._openmp_bpf is not None:
            # One snapshot of both counters, then the log up to it: the target goes on
            # starting regions while the log is read.
            entries, ended = self._check_ends(self._openmp_bpf, warn=not self.regions_detached)
            stack_index: dict[int, int] = {}
            if self.walker is not None and self.walker.layout is not None:
                python, stack_index = self.walker.read()
            if not self.regions_detached:
                self._read_regions(self._openmp_bpf, ended, stack_index)
            if self._sampling:
                native_notes = self._take_samples(self._openmp_bpf, python, stack_index)
            if self._sched_bpf is not None and stack_index:
                python["offcpu"] = {
                    "tid": [tid for (_, tid) in offcpu_by_stack],
                    "stack": [stack_index.get(stack, -1) for (stack, _) in offcpu_by_stack],
                    "ns": [v[0] for v in offcpu_by_stack.values()],
                    "switches": [v[1] for v in offcpu_by_stack.values()],
                }
            payload["region_entries"] = entries
            hist = self._openmp_bpf["duration_us_log2"]
            payload["histogram_us_log2"] = {
                str(k.value): v.value for k, v in hist.items() if v.value
            }
        self.cleanup()
        return self._finish(payload, end_ns, native_notes, python)

    def _stop_core(self) -> CollectorResult:
        assert self._context is not None and self._core is not None and self.walker is not None
        end_ns = self._context.clock()
        python, stack_index = self.walker.read()
        native_notes = self._take_samples(self._core, python, stack_index)
        self.cleanup()
        payload: dict[str, object] = {"threads": {}, "wakeups": [], "histogram_us_log2": {}}
        return self._finish(payload, end_ns, native_notes, python)

    def _take_samples(
        self, bpf: BpfProgram, python: dict[str, object], stack_index: dict[int, int]
    ) -> dict[str, object]:
        """The sampler's logs into the walker's part of ebpf.json, and native.json where it
        took native stacks; the notes on them for the manifest."""
        assert self._context is not None
        python["samples"], python["dispatched"], native = self._read_samples(bpf, stack_index)
        if native is None:
            return {}
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
                "sched": self.sched_decision,
                "regions_decision": self.region_decision,
                "window": {"start_ns": self._start_ns, "end_ns": end_ns},
                "runtime": (
                    self._context.target.openmp_runtime.path
                    if self._context.target.openmp_runtime
                    else None
                ),
                # Every runtime copy whose region probes went on; regions.runtime indexes it.
                "runtimes": self.probed_runtimes,
                "loader": (
                    {"name": "core", "libbpf": libbpf.version()}
                    if self.loader == "core"
                    else {"name": "bcc"}
                ),
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
            },
        )

    def _check_ends(self, bpf: BpfProgram, warn: bool = True) -> tuple[int, int]:
        """Regions entered and ended so far; warns when ends went unseen (not after the probes
        were detached: regions in flight then lose their ends, and the log is not read)."""
        entries = entry_count(bpf)
        ended = int(bpf["region_count"][ctypes.c_int(0)].value)
        still_open = len(bpf["open_regions"])
        missed = entries - ended - still_open
        if warn and missed > max(5, entries // 100):
            self.warnings.append(
                f"{missed} of {entries} OpenMP regions ended where the end probe did not see "
                "them: region times are incomplete"
            )
        return entries, ended

    def _read_regions(self, bpf: BpfProgram, count: int, stack_index: dict[int, int]) -> None:
        """Copy the in-kernel region log out in one batch, after the window. Where the probes
        were switched, a region entered before the first on-time (during the rate check, before
        the window) or after its on-time closed (while the entry probes were going off, some
        still trapping) is left out: the regions kept are those of the on-times."""
        on = sorted(self._on_ns)
        opens = [a for a, _ in on]
        early = late = 0
        for _, v in read_log(bpf, "region_log", count, self.lost, "regions"):
            if on:
                at = bisect.bisect_right(opens, v.start_ns) - 1
                if at < 0:
                    early += 1  # the rate check's, before the window
                    continue
                if v.start_ns > on[at][1]:
                    late += 1
                    continue
            for key in ("start_ns", "end_ns", "tid", "requested", "runtime"):
                self.regions[key].append(getattr(v, key))
            self.regions["stack"].append(stack_index.get(int(v.stack), -1))
        if on:
            self.region_decision["regions_before_on_times"] = early
            self.region_decision["regions_after_on_times"] = late

    def _read_samples(
        self, bpf: BpfProgram, stack_index: dict[int, int]
    ) -> tuple[dict[str, object], dict[str, object], dict[str, Any] | None]:
        """The walker's on-CPU samples of the target's Python threads, in time order; those of
        its other threads, with their dispatcher's stack; and, where the sampler took them,
        every thread's native stacks as perf.json's tables."""
        count = int(bpf["sample_count"][ctypes.c_int(0)].value)
        columns: dict[str, list[int]] = {"t_ns": [], "tid": [], "stack": []}
        # Samples of threads that are not Python threads, each with its dispatcher's stack where
        # the program found one (dispatcher 0: none).
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
        self.lost["python_samples"] = lost["samples"]
        native = None
        if self._native:
            assert self._context is not None
            pid = self._context.target.pid
            native = native_tables(
                [(int(v.t_ns), int(v.tid), int(v.native)) for _, v in rows],
                read_stacks(bpf["native_stacks"]),
                pid,
                round(1e9 / self._sample_hz),
                # Without bcc, its symbol cache is not there either.
                ProcessSymbols(pid) if self.loader == "core" else None,
            )
            # Samples whose stack did not fit the full map, and those past the log.
            native["lost"] += int(bpf["native_counts"][ctypes.c_int(0)].value) + lost["samples"]
        return (
            {"rate_hz": self._sample_hz, **columns},
            {"rate_hz": self._sample_hz, **dispatched},
            native,
        )

    def _read_slices(self, sched: BpfProgram) -> None:
        """Copy the in-kernel slice log out in one batch, after the window."""
        count = sched["slice_count"][ctypes.c_int(0)].value
        for _, v in read_log(sched, "slice_log", count, self.lost, "slices"):
            self.slices["start_ns"].append(v.start_ns)
            self.slices["end_ns"].append(v.end_ns)
            self.slices["tid"].append(v.tid)
            self.slices["voluntary"].append(v.voluntary)

    def cleanup(self) -> None:
        """Detach every probe; safe to call more than once."""
        self._judged.wait(timeout=5)  # the rate check reads and detaches the region probes
        self._stop_cycle()
        if self.walker is not None:
            self.walker.halt()
        self._sched_bpf = self._openmp_bpf = None
        if self._core is not None:
            self._core.close()
            self._core = None
        while self._bpf:
            bpf = self._bpf.pop()
            with contextlib.suppress(Exception):
                detach_uprobes(bpf)
            with contextlib.suppress(Exception):
                bpf.cleanup()
