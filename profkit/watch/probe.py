"""The OpenMP region probe and Python stack walker of one process, kept loaded and read
cumulatively: regions entered, and regions and region time per Python stack, all counted in the
kernel (capture/ebpf/probes/openmp.bpf.c), so that reading them once an interval costs one
map walk.

The probes' traps cost the dispatching thread a few microseconds a region. Where the target
starts so many regions that this would cost more than the probes' part of the budget (the one a
capture's probes keep: REGION_PROBE_PART of the default --budget), the probes are switched on
for a fraction of the time and off for the rest, as a capture's are (capture/ebpf/duty.py): the
regions of the on-times are a sample in time, whose stacks split the pool's CPU. The rate is
checked as the probe loads and at every window after.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from dataclasses import dataclass

from ..bundle.frames import Frame
from ..capture.budget import REGION_PROBE_PART, Budget
from ..capture.collectors.base import EbpfLoader
from ..capture.ebpf.collector import EbpfCollector
from ..capture.ebpf.duty import PERIOD_S, DutyCycle
from ..capture.ebpf.policy import RegionDecision, Spent, decide_regions
from ..capture.ebpf.pywalk import SHIM_FRAME, resolve_frame
from ..host.pyruntime import CodeResolver, PyRuntimeUnsupported
from ..host.pyruntime import thread_states as read_thread_states
from ..host.target import Target
from ..host.targetfs import SourceLines

# What the probes may cost the dispatching threads, as a fraction of their time.
PROBE_BUDGET = REGION_PROBE_PART * Budget().fraction
# The first count, as the probe loads: long enough for a few hundred regions of a busy target.
RATE_CHECK_S = 0.3


@dataclass(frozen=True)
class StackCounts:
    regions: int
    region_ns: int


def release_heap() -> None:
    """Give freed heap back to the system. Compiling a probe (clang, in this process) leaves
    megabytes of freed but retained heap behind each time; an agent that compiles one per new
    process would otherwise grow with every restart of its targets."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)  # glibc only: elsewhere nothing to do


class RegionProbe:
    """Load with start(); read() any number of times; close() detaches everything."""

    def __init__(self, target: Target, loader: EbpfLoader = "auto") -> None:
        self.target = target
        self.loader = loader
        self.status = "off"
        self.reason = ""
        self.walker_reason = ""
        self._collector: EbpfCollector | None = None
        self._frames: dict[int, tuple[Frame, ...]] = {}
        self._cycle: DutyCycle | None = None
        # Entries by copy, the region programs' nanoseconds, and when: the last count's.
        self._counted: tuple[Spent, float] = (Spent(), 0.0)
        self.switched = ""  # why the probes are switched on and off, once they are
        self.decision: RegionDecision | None = None  # the policy's last

    @property
    def duty(self) -> float:
        """The fraction of the time the region probes are on: 1 unless they are switched."""
        return 1.0 if self._cycle is None else self._cycle.duty

    @property
    def bpf(self) -> object | None:
        return None if self._collector is None else self._collector.program

    @property
    def walker_on(self) -> bool:
        c = self._collector
        return bool(c and c.walker and c.walker.running)

    def start(self) -> None:
        runtime = self.target.openmp_runtime
        if runtime is None:
            self.reason = "no OpenMP runtime mapped: no region probe (pool CPU from /proc only)"
            return
        unavailable = EbpfCollector().available(self.target)
        if not unavailable.ok:
            self.reason = f"no region probe: {unavailable.reason}"
            return
        collector = EbpfCollector()
        self._collector = collector
        try:
            # No logs, no sampler, no tracepoints: only the cumulative counters are read.
            collector.load_counters(self.target, loader=self.loader)
        except Exception as exc:
            self.close()
            release_heap()
            self.reason = f"region probe failed to load: {str(exc).splitlines()[0][:200]}"
            return
        if not any(a.startswith(("uprobe:", "uretprobe:")) for a in collector.attached):
            self.reason = "; ".join(collector.warnings) or "no region probe could be attached"
            self.close()
            return
        self.status = "on"
        release_heap()
        walker = collector.walker
        self.walker_reason = "" if self.walker_on else (walker.reason if walker else "")
        collector.calibrate()  # an earlier capture's of the last hour, or made now (costs.py)
        self._counted = (collector.measured(), time.monotonic())
        time.sleep(RATE_CHECK_S)
        self.check_rate()

    def check_rate(self) -> None:
        """Carry out the one policy (capture/ebpf/policy.py) on the regions counted since the
        last check and what they were measured to cost, as a capture's rate check does:
        switched, the probes adapt the duty to each on-time's rate and cost themselves
        (duty.py). Nothing but the regions places the pool here, so the probes never come off.
        """
        c = self._collector
        if c is None or self._cycle is not None:
            return
        before, since = self._counted
        now = time.monotonic()
        count = c.region_count(before, now - since)
        self._counted = (c.measured(), now)
        if count.per_s <= 0:
            return
        decision = decide_regions(count, PROBE_BUDGET, stacks=self.walker_on, placed_by="")
        self.decision = decision
        if decision.action != "switch":
            return
        self._cycle = DutyCycle(
            decision,
            time.monotonic_ns,
            c.attach_region_probes,
            c.detach_region_probes,
            measure=c.measured,
            start_on=True,
        )
        self._cycle.start(count.per_s)
        self._cycle.window_opened()
        self.switched = switched_reason(decision)

    def regions(self) -> int:
        bpf = self.bpf
        if bpf is None:
            return 0
        try:
            table = bpf["runtime_entries"]  # type: ignore[index]  # bcc: tables built at run time
            return sum(int(table[ctypes.c_int(i)].value) for i in self._openmp_copies())
        except Exception:
            return 0

    def _openmp_copies(self) -> set[int]:
        """Indexes of the OpenMP runtime copies probed: an OpenBLAS pool's regions are counted
        apart by the collector, and are not this pool's."""
        c = self._collector
        if c is None:
            return set()
        return {
            # probed_runtimes holds RuntimeProbes.describe()'s dict[str, object].
            int(r["index"])  # type: ignore[call-overload]  # an int, typed object there
            for r in c.probed_runtimes
            if r["pool"] == "openmp"
        }

    def python_tids(self) -> set[int] | None:
        """Threads the interpreter knows, or None where its layout is unknown."""
        c = self._collector
        if c is None or c.walker is None or c.walker.layout is None:
            return None
        if c.walker.running:
            return c.walker.python_threads()  # kept current by the walker itself
        try:
            return set(read_thread_states(self.target.pid, c.walker.layout))
        except (PyRuntimeUnsupported, OSError):
            return None

    def walk_counts(self) -> dict[str, int]:
        """The walker's outcomes so far, by WALK_COUNTS name; {} while it is off."""
        c = self._collector
        return c.walker.counts() if self.walker_on and c and c.walker else {}

    def stacks(self) -> dict[int, tuple[StackCounts, tuple[Frame, ...]]]:
        """Every stack seen so far with its cumulative counts; frames resolved once per id."""
        bpf = self.bpf
        if bpf is None or not self.walker_on:
            return {}
        # Only the OpenMP copies' regions: the sites split the OpenMP pool's CPU.
        copies = self._openmp_copies()
        try:
            table = bpf["pystack_stats"]  # type: ignore[index]  # bcc: tables built at run time
            stats: dict[int, StackCounts] = {}
            for k, v in table.items():
                if int(k.runtime) not in copies:
                    continue
                seen = stats.get(int(k.stack), StackCounts(0, 0))
                stats[int(k.stack)] = StackCounts(
                    seen.regions + int(v.regions), seen.region_ns + int(v.region_ns)
                )
        except Exception:
            return {}
        new = [i for i in stats if i not in self._frames]
        if new:
            self._resolve(bpf, new)
        return {i: (counts, self._frames.get(i, ())) for i, counts in stats.items()}

    def _resolve(self, bpf: object, ids: list[int]) -> None:
        c = self._collector
        assert c is not None and c.walker is not None and c.walker.layout is not None
        table = bpf["pystacks"]  # type: ignore[index]  # bcc: tables built at run time
        try:
            resolver = CodeResolver(self.target.pid, c.walker.layout)
        except OSError:
            return
        sources = SourceLines(self.target.pid)
        try:
            for stack_id in ids:
                try:
                    value = table[ctypes.c_uint64(stack_id)]
                except KeyError:
                    continue
                depth = min(int(value.depth), len(value.code))
                frames = []
                for i in reversed(range(depth)):
                    if int(value.instr[i]) & SHIM_FRAME:
                        continue
                    frames.append(
                        resolve_frame(resolver, sources, int(value.code[i]), int(value.instr[i]))
                    )
                self._frames[stack_id] = tuple(frames)
        finally:
            resolver.close()

    def close(self) -> None:
        if self._cycle is not None:
            self._cycle.stop()
            self._cycle = None
        if self._collector is not None:
            with contextlib.suppress(Exception):
                self._collector.cleanup()
        self._collector = None
        self.status = "off"
        release_heap()


def switched_reason(decision: RegionDecision) -> str:
    count = decision.count
    return (
        f"region probes switched on {100 * decision.duty:.0f}% of the time (every {PERIOD_S:g} s "
        f"or so): the target started {count.per_s:,.0f} regions a second, "
        f"~{100 * count.cost:.1f}% of its dispatching thread at "
        f"{1e6 * count.cost_per_region_s:.1f} us per region (measured), over their "
        f"{100 * decision.budget:.2g}% part of the budget; the sites split the pool's CPU by the "
        "regions of the on-times"
    )


class NoProbe(RegionProbe):
    """--no-probes: /proc and the cgroup only."""

    def start(self) -> None:
        self.reason = ""
