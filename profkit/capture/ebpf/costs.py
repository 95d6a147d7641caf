"""What the probes cost, measured where they run: no cost is a constant.

A region costs its dispatching thread two traps (the entry probe's and the end probe's) and the
two programs' run time; a context switch costs the scheduler's programs' run time and their
dispatch. Two measurements give these:

- The programs' own run time comes from the kernel's BPF statistics (BPF_ENABLE_STATS, on for
  as long as the returned switch is held open): run count and nanoseconds per program, in place,
  in the target's own threads, whatever its caches hold.
- The traps' cost is calibrated on the running machine: an empty program (on_calibrate) on an
  instruction of libc's free(), in profkit's own process, at an instruction the kernel emulates
  and at one it single-steps (the two kinds the region probes sit on, placement/points.py),
  and free(NULL) called with the probe on and off, each call's cost read from the calling
  thread's own CPU clock. The thread's CPU clock counts only its own time, kernel time
  included, so other load on a busy server does not enter the figure; what a server's own work
  does to the trap, evicting the caches the trap path runs through between two regions, is
  reproduced by sweeping a buffer the size of the CPU's L2 cache between calls (warm, in a tight
  loop, a trap costs a fraction of that: docs/results/ebpf-cost.md#the-traps-calibrated).
  A calibration is kept for the captures of the next hour (host/bootcache.py): the kernel and
  the CPU it measures do not change while the machine runs, and each capture would otherwise
  spend its CPU on the same answer; made again hourly, one slow calibration does not rule
  every capture after it.

Both are read as the decisions are made (policy.py): the region rate check takes each copy's
measured cost a region, the scheduler's trial its measured cost a switch.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ...host import bootcache, mapped
from .placement.code import CALL, ENDBR, JUMP, RET, TOOL_ERRORS, disassemble, file_offset
from .placement.code import symbol_address as code_symbol_address

SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0

# The calibration: calls per batch, batches per phase (their median kept).
CALLS = 400
BATCHES = 3
KEPT_S = 3600.0  # how long a calibration is kept for later captures


class _EnableStatsAttr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32)]


@dataclass
class StatsSwitch:
    """The kernel's BPF run-time statistics, on while this is held (a descriptor of the
    kernel's; closing it turns them off again unless someone else holds one)."""

    fd: int = -1
    reason: str = ""

    @property
    def on(self) -> bool:
        return self.fd >= 0

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def enable_stats() -> StatsSwitch:
    """BPF statistics on (BPF_ENABLE_STATS, Linux 5.8 and later); where the kernel refuses, a
    switch that is off and says why."""
    number = SYS_BPF.get(platform.machine())
    if number is None:
        return StatsSwitch(reason=f"the bpf system call's number on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    attr = _EnableStatsAttr(BPF_STATS_RUN_TIME)
    fd = int(
        libc.syscall(
            ctypes.c_long(number),
            ctypes.c_int(BPF_ENABLE_STATS),
            ctypes.byref(attr),
            ctypes.c_uint(ctypes.sizeof(attr)),
        )
    )
    if fd < 0:
        err = ctypes.get_errno() or errno.EINVAL
        return StatsSwitch(reason=f"BPF_ENABLE_STATS refused: {os.strerror(err)}")
    return StatsSwitch(fd)


@dataclass(frozen=True)
class TrapCost:
    """What one trap costs the thread that takes it, by the kind of instruction it sits on."""

    emulated_s: float
    stepped_s: float
    how: str
    made_unix: float = 0.0  # when the calibration was made
    made_by_pid: int = 0  # by this process, or by an earlier capture's
    kept: bool = False  # an earlier capture's, kept (bootcache.py)

    def of(self, emulated: bool) -> float:
        return self.emulated_s if emulated else self.stepped_s

    def as_record(self) -> dict[str, object]:
        return {
            "emulated_us": round(self.emulated_s * 1e6, 3),
            "stepped_us": round(self.stepped_s * 1e6, 3),
            "how": self.how,
            "made_unix": round(self.made_unix, 3),
            "made_by_pid": self.made_by_pid,
            "kept": self.kept,
        }


@dataclass(frozen=True)
class _Points:
    path: str  # profkit's own libc, through its map_files path
    emulated: tuple[int, int, str]  # (address, file offset, instruction)
    stepped: tuple[int, int, str]


def _calibration_points() -> _Points | None:
    """Two instructions that every free(NULL) runs (the straight line from free's entry to its
    first branch, the branch included): one the kernel emulates, one it single-steps."""
    libc = ctypes.CDLL(None)
    own = ctypes.cast(libc.free, ctypes.c_void_p).value
    if own is None:
        return None
    maps = mapped.read_maps(os.getpid())
    mapping = next((m for m in maps if m.start <= own < m.end and m.path.startswith("/")), None)
    if mapping is None:
        return None
    path = mapped.checked_path(os.getpid(), mapping)
    address = code_symbol_address(path, "free")
    if address is None:
        return None
    emulated = stepped = None
    for instruction in disassemble(path, address, address + 64):
        if instruction.emulated and emulated is None:
            emulated = instruction
        elif not instruction.emulated and instruction.kind != ENDBR and stepped is None:
            stepped = instruction
        if instruction.kind in (JUMP, CALL, RET):
            break  # past the first branch free(NULL) may not go
    if emulated is None or stepped is None:
        return None

    def where(instruction: object) -> tuple[int, int, str]:
        at = instruction.address  # type: ignore[attr-defined]
        return at, file_offset(path, at), instruction.text  # type: ignore[attr-defined]

    return _Points(path, where(emulated), where(stepped))


def sweep_bytes() -> int:
    """The CPU's L2 cache (what a server's work between two regions evicts at least), 256 KiB
    to 2 MiB; 1 MiB where sysfs does not say."""
    text = ""
    with contextlib.suppress(OSError):
        text = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
    units = {"K": 1 << 10, "M": 1 << 20}
    try:
        size = int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)
    except ValueError:
        size = 1 << 20
    return min(2 << 20, max(256 << 10, size))


def _per_call_s(free: object, sweep: ctypes.Array[ctypes.c_char]) -> float:
    """The median over batches of what one free(NULL) costs this thread, a sweep of the buffer
    between calls (its own cost is the same with the probe on or off)."""
    clock, memset, size = time.thread_time_ns, ctypes.memset, len(sweep)
    batches = []
    for _ in range(BATCHES):
        spent = 0
        for i in range(CALLS):
            memset(sweep, i & 0xFF, size)
            began = clock()
            free(None)  # type: ignore[operator]
            spent += clock() - began
        batches.append(spent / CALLS / 1e9)
    return statistics.median(batches)


_LOCK = threading.Lock()


def calibrate(loader: str, attach: object, detach: object) -> TrapCost | None:
    """The traps' cost on this machine, measured once per process and loader (the machine does
    not change under it, and each loader attaches its uprobes its own way: bcc through perf
    events, CO-RE through links): attach(path, address, offset) puts the empty program on an
    instruction of profkit's own libc and returns a handle, detach(handle) takes it off. None
    where no two such instructions can be found or attached."""
    with _LOCK:
        if loader not in _cache:
            _cache[loader] = _kept(loader) or _keep(loader, _calibrated(attach, detach))
        return _cache[loader]


_cache: dict[str, TrapCost | None] = {}


def _kept(loader: str) -> TrapCost | None:
    """A calibration made by an earlier capture of this boot, within the last KEPT_S."""
    raw = bootcache.shared().get(f"traps-{loader}")
    if not raw:
        return None
    try:
        kept = json.loads(raw)
        made, pid = float(kept["unix"]), int(kept["pid"])
        emulated, stepped, how = float(kept["emulated_s"]), float(kept["stepped_s"]), kept["how"]
    except (ValueError, TypeError, KeyError):
        return None
    age = time.time() - made
    if not (0 <= age < KEPT_S and 0 <= emulated < 1e-3 and 0 <= stepped < 1e-3):
        return None
    if not isinstance(how, str):
        return None
    when = time.strftime("%H:%M:%S UTC", time.gmtime(made))
    how = f"{how}; made by pid {pid} at {when}, kept an hour for later captures"
    return TrapCost(emulated, stepped, how, made, pid, kept=True)


def _keep(loader: str, found: TrapCost | None) -> TrapCost | None:
    if found is not None:
        record = {
            "emulated_s": found.emulated_s,
            "stepped_s": found.stepped_s,
            "how": found.how,
            "unix": found.made_unix,
            "pid": found.made_by_pid,
        }
        bootcache.shared().put(f"traps-{loader}", json.dumps(record).encode())
    return found


def _calibrated(attach: object, detach: object) -> TrapCost | None:
    try:
        points = _calibration_points()
    except (*TOOL_ERRORS, mapped.UnverifiedFile):
        points = None
    if points is None:
        return None
    free = ctypes.CDLL(None).free
    free.argtypes, free.restype = [ctypes.c_void_p], None
    swept = sweep_bytes()
    sweep = ctypes.create_string_buffer(swept)
    handles = []
    try:
        off = _per_call_s(free, sweep)
        handles.append(attach(points.path, *points.emulated[:2]))  # type: ignore[operator]
        one = _per_call_s(free, sweep)
        handles.append(attach(points.path, *points.stepped[:2]))  # type: ignore[operator]
        both = _per_call_s(free, sweep)
    except Exception:
        found = None
    else:
        how = (
            f"calibrated: free(NULL) in profkit's own process, {BATCHES} batches of {CALLS} calls "
            f"with an empty program on `{points.emulated[2]}` (emulated) and then also on "
            f"`{points.stepped[2]}` (single-stepped), against none, each call's cost from the "
            f"thread's CPU clock, {swept >> 10} KiB (the L2 cache) swept between calls"
        )
        found = TrapCost(max(0.0, one - off), max(0.0, both - one), how, time.time(), os.getpid())
    finally:
        for handle in handles:
            with contextlib.suppress(Exception):
                detach(handle)  # type: ignore[operator]
    return found


@contextlib.contextmanager
def stats_on() -> Iterator[StatsSwitch]:
    switch = enable_stats()
    try:
        yield switch
    finally:
        switch.close()


@lru_cache(maxsize=1)
def online_cpus() -> int:
    return len(os.sched_getaffinity(0)) or (os.cpu_count() or 1)
