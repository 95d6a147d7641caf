"""One watched process: its threads' CPU from /proc and its region probe, closed into windows.

Pool workers are found without stopping anything. A thread the interpreter does not know whose
user-space instruction pointer (/proc/PID/task/TID/syscall, readable while the thread is off
CPU) lies in the OpenMP runtime's code is a worker: waiting at the team barrier, or preempted
while spinning there. A thread seen blocked in a system call elsewhere is not an OpenMP worker
(libgomp blocks only in its own futex calls). A thread never seen off CPU, as a spinning worker
on an idle machine can be, counts as a worker while it burns CPU if it carries the process's own
name, as OpenMP workers do (the inference `report` makes without perf or eBPF data).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from ..analysis.attribution import resolve_op
from ..bundle.names import shown
from ..errors import ProfkitError
from ..host import mapped, procfs
from ..host.pythreads import python_thread_names
from ..host.target import Runtime, Target, inspect, pool_threads
from .probe import Frame, NoProbe, RegionProbe, StackCounts

POOL_NAME = {"libgomp": "openmp", "libiomp5": "openmp"}
UNKNOWN_SITE = "unknown"


@dataclass(frozen=True)
class SiteKey:
    """A row of watch's sites: the innermost Python frame that dispatched the regions and its
    op, or, without a frame, one of the rows that stand for several (unknown, other)."""

    frame: Frame | None
    op: str = ""
    row: str = ""  # UNKNOWN_SITE or OTHER_SITE where frame is None

    @property
    def site(self) -> str:
        return self.frame.label if self.frame else self.row

    @property
    def function(self) -> str:
        return self.frame.function if self.frame else ""


@dataclass(frozen=True)
class ProcessWindow:
    """What one process did between two reads."""

    seconds: float
    process_cpu: float
    python_cpu: float
    pool_cpu: float
    regions: int
    regions_with_stack: int  # of those, regions whose dispatching Python stack was read
    walk_failures: dict[str, int]  # regions the walker read no stack for, by WALK_COUNTS reason
    runtime: str | None  # pool name ("openmp"), None without an OpenMP runtime
    team_size: int  # workers seen + the dispatching thread, else the configured pool
    team_source: str
    site_cpu: dict[SiteKey, float]
    site_stacks: dict[SiteKey, tuple[Frame, ...]]
    python_threads: dict[str, float]  # "name (tid)" -> CPU seconds
    other_threads: dict[str, float]
    # The fraction of the time the region probes were on: below 1 where they are switched
    # (watch/probe.py), and regions then counts the on-times' regions only.
    probe_duty: float = 1.0


# The walker's outcomes that leave a region without a stack (capture/ebpf/pywalk.py WALK_COUNTS;
# "truncated" stacks still carry their innermost frames, and so their site).
# Threads whose /proc stat the agent reads a second, at most, in its full reads (as the /proc
# collector of a capture, capture/collectors/procstat.py): a target's thread count is its own.
THREAD_READS_PER_S = 200
WALK_FAILURES = ("no_thread_state", "read_failures", "no_python_frame")


def _regions_with_frames(stacks: dict[int, tuple[StackCounts, tuple[Frame, ...]]]) -> int:
    return sum(counts.regions for counts, frames in stacks.values() if frames)


def _code_ranges(pid: int, runtime: Runtime) -> list[tuple[int, int]]:
    """Where the runtime's code is mapped: its file's executable mappings (by device and
    inode where the file is known, host/mapped.py; a name can be shared)."""
    own = runtime.file.mapping if runtime.file is not None else None
    return [
        (m.start, m.end)
        for m in mapped.read_maps(pid)
        if "x" in m.perms
        and ((m.device, m.inode) == (own.device, own.inode) if own else m.path == runtime.path)
    ]


def _user_pc(pid: int, tid: int) -> tuple[int, int] | None:
    """(system call number or -1, user-space instruction pointer) of a thread off CPU, else
    None."""
    try:
        text = (procfs.task_dir(pid, tid) / "syscall").read_text().split()
    except OSError:
        return None
    if not text or text[0] == "running" or len(text) < 3:
        return None
    try:
        return int(text[0]), int(text[-1], 16)
    except ValueError:
        return None


# threading's names are read (py-spy dump, a few hundredths of a second of its CPU) when a Python
# thread without one appears, at most this often.
PYTHON_NAMES_EVERY_S = 60.0
MAX_THREAD_LABEL = 64  # a thread's name in a series label or a flame frame


@dataclass
class WatchedProcess:
    target: Target
    probe: RegionProbe
    started_s: float = field(default_factory=time.monotonic)
    _cpu: dict[int, float] = field(default_factory=dict)
    _names: dict[int, str] = field(default_factory=dict)
    _python_names: dict[int, str] = field(default_factory=dict)  # threading's, where read
    _python_names_read_s: float = -PYTHON_NAMES_EVERY_S
    _process_cpu: float = 0.0
    _regions: int = 0
    _stacks: dict[int, int] = field(default_factory=dict)  # stack id -> region_ns so far
    # Where the probes are switched, a window without an on-time splits its pool's CPU as the
    # last window with one did.
    _last_sites: tuple[dict[SiteKey, float], dict[SiteKey, tuple[Frame, ...]]] = field(
        default_factory=lambda: ({}, {})
    )
    _with_stack: int = 0  # regions so far whose stack resolved to frames
    _walks: dict[str, int] = field(default_factory=dict)  # the walker's counts so far
    _workers: set[int] = field(default_factory=set)  # seen in the runtime's code
    _not_workers: set[int] = field(default_factory=set)  # seen blocked outside it
    _runtime_code: list[tuple[int, int]] = field(default_factory=list)
    _last_s: float = 0.0
    _python_tids: set[int] = field(default_factory=set)
    _full_read_s: float = -math.inf  # when every thread's CPU was last read
    _active: set[int] = field(default_factory=set)  # threads with CPU at that read
    # The probe loads on the agent's loader thread (a compile takes seconds): windows close
    # from /proc alone until it is ready, and a process closed meanwhile has its probe
    # detached by the loader as soon as the load ends.
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _probe_ready: bool = False
    # When the probe's baseline was taken: the window it falls in has regions for its rest only.
    _ready_s: float = 0.0
    _loading: bool = False
    _closed: bool = False

    @property
    def pid(self) -> int:
        return self.target.pid

    @property
    def runtime(self) -> str | None:
        rt = self.target.openmp_runtime
        return POOL_NAME.get(rt.name) if rt else None

    @property
    def awaiting_runtime(self) -> bool:
        """Found before it loaded an OpenMP runtime (torch not imported yet): looked at again
        each window, probe or not, for the pool's CPU."""
        return self.target.openmp_runtime is None

    @property
    def needs_probe(self) -> bool:
        """A probe to load: a runtime is mapped and the probe was neither loaded nor tried."""
        return (
            not isinstance(self.probe, NoProbe)
            and self.target.openmp_runtime is not None
            and not self._probe_ready
            and not self._loading
            and self.probe.status == "off"
            and not self.probe.reason
        )

    def begin(self, load_probe: bool = True) -> None:
        """Take the baseline (and load the probe here unless the caller loads it apart with
        load_probe()); the first window closes at the next read."""
        if load_probe:
            self.load_probe()
        self._find_runtime_code()
        self._cpu = self._read_threads()
        self._classify(list(self._cpu))
        self._process_cpu = procfs.read_stat(self.pid).cpu_seconds
        self._last_s = time.monotonic()

    def load_probe(self) -> None:
        """Load the probe, then take its baseline. Safe on another thread than the windows'."""
        with self._lock:
            if self._closed or self._loading:
                return
            self._loading = True
        probe = self.probe
        try:
            probe.start()
        finally:
            with self._lock:
                self._loading = False
                if self._closed or probe is not self.probe:
                    probe.close()
                else:
                    self._baseline_probe()
                    self._probe_ready = True

    def _find_runtime_code(self) -> None:
        """Where the runtime's code is mapped, read once it is: a thread found waiting there is
        a worker. It comes from the maps, not the probe, so that pool CPU counts from the first
        window, while a probe loads, and where none can (--no-probes included)."""
        rt = self.target.openmp_runtime
        if rt is not None and not self._runtime_code:
            with contextlib.suppress(OSError):
                self._runtime_code = _code_ranges(self.pid, rt)

    def _baseline_probe(self) -> None:
        self._find_runtime_code()
        self._regions = self.probe.regions()
        stacks = self.probe.stacks()
        self._stacks = {i: c.region_ns for i, (c, _) in stacks.items()}
        self._with_stack = _regions_with_frames(stacks)
        self._walks = self.probe.walk_counts()
        self._ready_s = time.monotonic()

    def look_for_runtime(self) -> bool:
        """Read the process's maps again; True once it has loaded an OpenMP runtime, with a
        fresh probe for it that needs_probe says to load."""
        try:
            target = inspect(self.pid)
        except ProfkitError:
            return False
        if target.start_ticks != self.target.start_ticks or target.openmp_runtime is None:
            return False
        with self._lock:
            if self._loading:
                return False
            self.target = target
            self._find_runtime_code()
            self.probe.close()
            self.probe = (
                NoProbe(target)
                if isinstance(self.probe, NoProbe)
                else RegionProbe(target, self.probe.loader)
            )
            self._probe_ready = False
        return True

    def exec_seen(self) -> bool:
        """True when the process exec'd since it was inspected (same pid and start time, another
        program run: its walker and labels are stale)."""
        if self.target.image is None:
            return False
        return not procfs.read_image(self.pid).same_program_run(self.target.image)

    def _read_threads(self) -> dict[int, float]:
        """Each thread's cumulative CPU. Every thread is listed and read at most once every
        threads / THREAD_READS_PER_S seconds; in between, only those that used CPU at the last
        full read and the pool's workers are. A thread left unread keeps its last value, so its
        CPU counts in the window that reads it next (a new thread's, from its start): none is
        lost."""
        now = time.monotonic()
        full = now - self._full_read_s >= len(self._cpu) / THREAD_READS_PER_S
        # Listing the threads is itself a pass over all of them in the kernel: full reads only.
        tids = procfs.list_tids(self.pid) if full else list(self._cpu)
        alive = set(tids)
        cpu = {tid: c for tid, c in self._cpu.items() if tid in alive}
        wanted = tids if full else [t for t in tids if t in self._active or t in self._workers]
        for tid in wanted:
            try:
                stat = procfs.read_stat(self.pid, tid)
            except (FileNotFoundError, ProcessLookupError):
                cpu.pop(tid, None)
                continue
            cpu[tid] = stat.cpu_seconds
            self._names[tid] = stat.comm
        if full:
            self._full_read_s = now
            self._active = {t for t, c in cpu.items() if c > self._cpu.get(t, 0.0)}
        for gone in set(self._names) - set(cpu):
            del self._names[gone]
        return cpu

    def _classify(self, tids: list[int]) -> None:
        python = self.probe.python_tids() if self._probe_ready else None
        self._python_tids = python if python else {self.pid}
        if not self._runtime_code:
            return
        for tid in tids:
            if tid in self._workers or tid in self._python_tids or tid == self.pid:
                continue
            if tid in self._not_workers:
                continue
            seen = _user_pc(self.pid, tid)
            if seen is None:
                continue
            nr, pc = seen
            if any(lo <= pc < hi for lo, hi in self._runtime_code):
                self._workers.add(tid)
            elif nr >= 0:
                self._not_workers.add(tid)

    def _read_python_names(self, now: float) -> None:
        """threading's names of the Python threads, read again where one has none yet (and
        not within PYTHON_NAMES_EVERY_S of the last read); bounded and escaped as labels."""
        unnamed = self._python_tids - set(self._python_names)
        if not unnamed or now - self._python_names_read_s < PYTHON_NAMES_EVERY_S:
            return
        self._python_names_read_s = now
        names, _ = python_thread_names(self.pid)
        alive = set(self._names)
        self._python_names = {
            tid: shown(name)[:MAX_THREAD_LABEL] for tid, name in names.items() if tid in alive
        }

    def _pool_members(self, deltas: dict[int, float]) -> set[int]:
        if not self._runtime_code:
            return set()
        own = self._names.get(self.pid)
        provisional = {
            tid
            for tid, cpu in deltas.items()
            if cpu > 0
            and tid != self.pid
            and tid not in self._python_tids
            and tid not in self._not_workers
            and self._names.get(tid) == own
        }
        return self._workers | provisional

    def close_window(self) -> ProcessWindow:
        """Read everything again; raises FileNotFoundError once the process has exited."""
        with self._lock:
            return self._close_window()

    def _close_window(self) -> ProcessWindow:
        now = time.monotonic()
        process_cpu = procfs.read_stat(self.pid).cpu_seconds
        cpu = self._read_threads()
        self._classify(list(cpu))
        ready = self._probe_ready
        regions = self.probe.regions() if ready else 0
        stacks = self.probe.stacks() if ready else {}
        # A thread first seen now started within the window: all its CPU is the window's.
        deltas = {tid: max(0.0, c - self._cpu.get(tid, 0.0)) for tid, c in cpu.items()}
        members = self._pool_members(deltas)
        pool_cpu = sum(d for tid, d in deltas.items() if tid in members)
        self._read_python_names(now)
        python_threads = {
            f"{self._python_names.get(t) or self._names.get(t, '?')} ({t})": d
            for t, d in deltas.items()
            if t in self._python_tids and d > 0
        }
        others = {
            f"{self._names.get(t, '?')} ({t})": d
            for t, d in deltas.items()
            if t not in self._python_tids and t not in members and d > 0
        }
        site_ns: dict[SiteKey, float] = {}
        site_stacks: dict[SiteKey, tuple[Frame, ...]] = {}
        for stack_id, (counts, frames) in stacks.items():
            grown = counts.region_ns - self._stacks.get(stack_id, 0)
            if grown <= 0 or not frames:
                continue
            key = site_key(frames)
            site_ns[key] = site_ns.get(key, 0.0) + grown
            site_stacks.setdefault(key, frames)
        duty = self.probe.duty if ready else 1.0
        if duty < 1.0:
            # Switched: the on-times are a sample in time of the window since the probe was
            # ready, and a window without one is split as the last one with one.
            if site_ns:
                self._last_sites = (site_ns, site_stacks)
            else:
                site_ns, site_stacks = self._last_sites
        probed = probed_fraction(self._ready_s, self._last_s, now)
        site_cpu = split_pool_cpu(pool_cpu, site_ns, probed)
        with_stack = _regions_with_frames(stacks)
        walks = self.probe.walk_counts() if ready else {}
        failures = {
            name: max(0, n - self._walks.get(name, 0))
            for name, n in walks.items()
            if name in WALK_FAILURES
        }
        configured, source = pool_threads(self.target)
        if members and self.runtime:
            team, source = len(members) + 1, "workers seen in /proc"
        else:
            team = configured
        window = ProcessWindow(
            seconds=now - self._last_s,
            process_cpu=max(0.0, process_cpu - self._process_cpu),
            python_cpu=sum(python_threads.values()),
            pool_cpu=pool_cpu,
            regions=max(0, regions - self._regions),
            regions_with_stack=max(0, with_stack - self._with_stack),
            walk_failures=failures,
            runtime=self.runtime,
            team_size=team,
            team_source=source,
            site_cpu=site_cpu,
            site_stacks=site_stacks,
            python_threads=python_threads,
            other_threads=others,
            probe_duty=duty,
        )
        self._cpu, self._process_cpu, self._regions, self._last_s = cpu, process_cpu, regions, now
        self._stacks = {i: c.region_ns for i, (c, _) in stacks.items()}
        self._with_stack, self._walks = with_stack, walks
        if ready:
            self.probe.check_rate()  # switches the probes where this window's regions cost more
        return window

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._loading:
                return  # load_probe detaches it when the load ends
        self.probe.close()


def site_key(frames: tuple[Frame, ...]) -> SiteKey:
    inner = frames[-1]
    op, _ = resolve_op(Counter(), [], inner.code)
    return SiteKey(inner.located(), op or "")


def probed_fraction(ready_s: float, window_start_s: float, now_s: float) -> float:
    """The part of a window the probe counted regions in: the probe may become ready (a bcc
    compile takes seconds) partway through the window."""
    if ready_s <= window_start_s or now_s <= window_start_s:
        return 1.0
    return max(0.0, min(1.0, (now_s - ready_s) / (now_s - window_start_s)))


def split_pool_cpu(
    pool_cpu: float, site_ns: dict[SiteKey, float], probed: float
) -> dict[SiteKey, float]:
    """The pool's CPU by site in proportion to region time; where the regions were counted for
    fraction of the window only, the rest of its CPU is the unknown site's (given to the sites seen
    late in the window, a few regions of one site would take all of it)."""
    total_ns = sum(site_ns.values())
    if total_ns <= 0:
        return {SiteKey(None, row=UNKNOWN_SITE): pool_cpu} if pool_cpu > 0 else {}
    placed = pool_cpu * probed
    split = {k: placed * ns / total_ns for k, ns in site_ns.items()}
    if pool_cpu - placed > 0:
        unknown = SiteKey(None, row=UNKNOWN_SITE)
        split[unknown] = split.get(unknown, 0.0) + pool_cpu - placed
    return split
