"""The OpenMP region probe and Python stack walker of one process, kept loaded and read
cumulatively: regions entered, and regions and region time per Python stack, all counted in the
kernel (capture/ebpf/probes/openmp.bpf.c), so that reading them once an interval costs one
map walk.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass

from ..bundle.frames import Frame
from ..capture.collectors.base import EbpfLoader
from ..capture.ebpf.collector import EbpfCollector
from ..capture.ebpf.pywalk import SHIM_FRAME, resolve_frame
from ..host.pyruntime import CodeResolver, PyRuntimeUnsupported
from ..host.pyruntime import thread_states as read_thread_states
from ..host.target import Target
from ..host.targetfs import SourceLines


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
        if self._collector is not None:
            with contextlib.suppress(Exception):
                self._collector.cleanup()
        self._collector = None
        self.status = "off"
        release_heap()


class NoProbe(RegionProbe):
    """--no-probes: /proc and the cgroup only."""

    def start(self) -> None:
        self.reason = ""
