"""The Python stack walker that rides on the OpenMP region probes.

At each region entry the probe reads the dispatching thread's CPython frame chain (code object
and instruction index per frame) and counts regions and their time per distinct stack in the
kernel (probes/pystack.bpf.c, compiled into openmp.bpf.c's program with PYSTACK). This module
decides whether the walker can run on a target (its interpreter's layout is known and passes a
self-check from user space), hands the layout to the compiler, keeps the kernel's thread-id ->
thread-state map current, and turns the kernel's stacks into file, function and line once per
code object after the window.

An interpreter whose layout is unknown or fails the self-check gets no walker: the manifest says
why, and the call site comes from py-spy as before. Wrong stacks are worse than none.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import asdict, dataclass, field

from ...bundle.frames import Frame
from ...host import procfs
from ...host.pyruntime import CodeResolver, Layout, PyRuntimeUnsupported, detect, self_check
from ...host.pyruntime import thread_states as read_thread_states
from ...host.targetfs import SourceLines
from .loaders import Program

# Flags in the kernel's instruction index (probes/pystack.bpf.c): a shim frame, dropped here;
# an index below the code's first instruction (a frame that has not started) wraps to this.
SHIM_FRAME = 0x8000_0000
NOT_STARTED = 0x7FFF_FFFF
WALK_COUNTS = ("walked", "no_thread_state", "read_failures", "truncated", "no_python_frame")
# How often the thread map is refreshed when the probe reports threads it does not know.
REFRESH_S = 0.5
# Threads listed a second, at most, when nothing says a new one came (see _watch).
LISTED_PER_S = 2000


@dataclass
class PythonWalker:
    """One target's walker: prepare() before compiling, attach() once loaded, read() at stop."""

    pid: int
    layout: Layout | None = None
    reason: str = ""
    refreshes: int = 0
    _bpf: Program | None = None
    _known: set[int] = field(default_factory=set)
    _mapped: dict[int, int] = field(default_factory=dict)  # in the kernel's map: their states
    # Python threads past the thread map's capacity (probes/pywalk.h): their stacks go unread.
    over_capacity: set[int] = field(default_factory=set)
    _native: set[int] = field(default_factory=set)
    _unmatched: dict[int, int] = field(default_factory=dict)
    _missed: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prepare(self) -> bool:
        """Whether the walker can run on the target: its interpreter's layout is known and
        passes the self-check; else `reason` says why not."""
        try:
            layout = detect(self.pid)
            self_check(self.pid, layout)
        except PyRuntimeUnsupported as exc:
            self.reason = f"Python stack walker off: {exc}"
            return False
        except OSError as exc:
            self.reason = f"Python stack walker off: cannot read the target: {exc}"
            return False
        self.layout = layout
        return True

    @property
    def running(self) -> bool:
        """The walker's layout is known and its program is attached."""
        return self.layout is not None and self._bpf is not None

    def attach(self, bpf: Program) -> None:
        """Seed the thread map, then keep it current while the window is open."""
        self._bpf = bpf
        self._refresh()
        self._thread = threading.Thread(target=self._watch, name="profkit-pywalk", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        assert self._bpf is not None and self.layout is not None
        try:
            found = read_thread_states(self.pid, self.layout)
        except (PyRuntimeUnsupported, OSError):
            return  # the target is exiting, or between two thread-list updates: next time
        table = self._bpf["tstates"]
        with self._lock:
            # The main thread first: where there are more Python threads than the map holds,
            # the one that most often dispatches keeps its place.
            for tid, tstate in sorted(found.items(), key=lambda item: item[0] != self.pid):
                if self._mapped.get(tid) == tstate:
                    continue  # a thread id reused by a new thread has a new state
                try:
                    table[ctypes.c_uint32(tid)] = ctypes.c_uint64(tstate)
                except Exception:  # the map is full (E2BIG; bcc raises a bare Exception)
                    self.over_capacity.add(tid)
                    continue
                self._mapped[tid] = tstate
            self._known |= set(found)
            # A worker no Python thread was seen waking is placed under the only Python
            # thread, where there is one (probes/pystack.bpf.c, dispatcher_of).
            sole = next(iter(found)) if len(found) == 1 else 0
            self._bpf["sole_python"][ctypes.c_int(0)] = ctypes.c_uint32(sole)
        self.refreshes += 1

    def _watch(self) -> None:
        """Threads started after attach are looked up when they appear: the target's tasks are
        listed when its thread count changes or the probe reports regions of threads it does
        not know, and at least every max(REFRESH_S, threads / LISTED_PER_S) seconds (listing
        is a pass over every thread in the kernel); the interpreter's thread list is read only
        when that finds a thread not seen before."""
        listed_s, count = 0.0, -1
        while not self._stop.wait(REFRESH_S):
            try:
                threads = procfs.read_stat(self.pid).num_threads
            except OSError:
                return  # the target is gone
            missed = self._count(1)
            # Regions from threads the map lacks call for a fresh look, unless the map is full.
            grew = missed > self._missed and not self.over_capacity
            due = time.monotonic() - listed_s >= max(REFRESH_S, threads / LISTED_PER_S)
            if threads == count and not grew and not due:
                continue
            try:
                tids = set(procfs.list_tids(self.pid))
            except OSError:
                return
            listed_s, count = time.monotonic(), threads
            if tids - self._known - self._native or grew:
                self._missed = missed
                self._refresh()
                # A thread still unmatched at its second look is not a Python thread (a pool
                # worker): it is not looked up again. (A new Python thread's id is written into
                # its thread state only once it runs, so one look is not enough.)
                for tid in tids - self._known:
                    self._unmatched[tid] = self._unmatched.get(tid, 0) + 1
                    if self._unmatched[tid] >= 2:
                        self._native.add(tid)

    def python_threads(self) -> set[int]:
        """The Python threads seen in the interpreter's thread list (those since exited
        included), as the walker keeps its map current."""
        with self._lock:
            return set(self._known)

    def counts(self) -> dict[str, int]:
        """The kernel's walk outcomes so far (WALK_COUNTS), zero before attach."""
        if self._bpf is None:
            return dict.fromkeys(WALK_COUNTS, 0)
        return {name: self._count(i) for i, name in enumerate(WALK_COUNTS)}

    def _count(self, index: int) -> int:
        assert self._bpf is not None
        try:
            return int(self._bpf["walk_counts"][ctypes.c_int(index)].value)
        except Exception:
            return 0

    def halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def read(self) -> tuple[dict[str, object], dict[int, int]]:
        """The walker's part of ebpf.json, and each kernel stack id's index in its stack list."""
        self.halt()
        if self.layout is None or self._bpf is None:
            return {"walker": "off", "reason": self.reason}, {}
        bpf = self._bpf
        counts = self.counts()
        # Counted per (stack, runtime copy) in the kernel; the bundle's per-region log says
        # which copy ran each region, so the stack list needs only the sums.
        stats: dict[int, tuple[int, int]] = {}
        for k, v in bpf["pystack_stats"].items():
            regions, region_ns = stats.get(k.stack, (0, 0))
            stats[k.stack] = (regions + v.regions, region_ns + v.region_ns)
        raw = {k.value: v for k, v in bpf["pystacks"].items()}
        resolver = CodeResolver(self.pid, self.layout)
        sources = SourceLines(self.pid)
        stacks: list[dict[str, object]] = []
        index: dict[int, int] = {}
        try:
            for stack_id, value in raw.items():
                depth = min(int(value.depth), len(value.code))
                frames = [
                    asdict(
                        resolve_frame(resolver, sources, int(value.code[i]), int(value.instr[i]))
                    )
                    for i in reversed(range(depth))  # outermost first, as flame graphs draw
                    if not int(value.instr[i]) & SHIM_FRAME
                ]
                regions, region_ns = stats.get(stack_id, (0, 0))
                index[stack_id] = len(stacks)
                stacks.append(
                    {
                        "id": f"{stack_id:016x}",
                        "regions": int(regions),
                        "region_ns": int(region_ns),
                        "truncated": bool(value.truncated),
                        "frames": frames,
                    }
                )
        finally:
            resolver.close()
        payload: dict[str, object] = {
            "walker": "on",
            "reason": "",
            "version": ".".join(map(str, self.layout.version)),
            "full_version": self.layout.version_text,
            "build": self.layout.build,
            "layout": self.layout.source,
            "counts": counts,
            "thread_map_refreshes": self.refreshes,
            "threads_over_capacity": len(self.over_capacity - set(self._mapped)),
            # Every thread found in the interpreter's thread list: the Python threads, idle or not.
            "threads": sorted(self._known),
            "stacks": stacks,
        }
        return payload, index


def resolve_frame(resolver: CodeResolver, sources: SourceLines, code: int, instr: int) -> Frame:
    if instr == NOT_STARTED:
        instr = -1
    info = resolver.resolve(code)
    if info is None:
        # Freed, reused or unreadable since the region: the frame is kept, unnamed.
        return Frame("<unknown>", "<unknown>", 0)
    line = resolver.line(code, instr) or 0
    return Frame(
        info.filename,
        info.qualname or info.name,
        line,
        sources.line(info.filename, line),
        python=True,
    )
