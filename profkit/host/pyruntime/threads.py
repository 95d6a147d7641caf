"""Thread states of a target interpreter, keyed by the thread ids the kernel reports to us.

The interpreter stores each thread's id as seen inside the target's PID namespace; probes and
/proc/PID/task report ids in our namespace.  ``NSpid:`` in /proc/PID/task/TID/status lists the
id in every namespace from ours (first) to the innermost (last), which joins the two.

3.10 thread states carry only the pthread_t.  With glibc, pthread_t is the address of the
thread's ``struct pthread``, whose ``tid`` field holds the kernel id; its offset is not part of
any ABI, so it is found by trying candidates and keeping one that names a live thread of the
target for every thread state.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import threading
from functools import lru_cache

from .errors import MemoryReadError, PyRuntimeUnsupported
from .layout import Layout
from .memory import ProcessMemory, u64_at

# Guards against a corrupt (cyclic) list.
MAX_THREADS = 100_000

# glibc x86-64 has kept struct pthread's tid here for many releases.
_GLIBC_TID_OFFSET = 0x2D0


def _same_pid_namespace(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino == os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return False


def namespace_tids(pid: int) -> dict[int, int]:
    """The target's tids as it sees them -> the same threads' tids as we see them."""
    mapping: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        raise PyRuntimeUnsupported(f"pid {pid}: cannot list threads: {exc.strerror}") from exc
    if _same_pid_namespace(pid):
        # One namespace: the ids agree, and no file per thread need be read (a target's thread
        # count is its own to choose).
        return {int(name): int(name) for name in tids}
    for name in tids:
        tid = int(name)
        inner = tid
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    inner = int(line.split()[-1])
                    break
        mapping[inner] = tid
    return mapping


def _tstates(mem: ProcessMemory, layout: Layout) -> list[tuple[int, int]]:
    """(address, native thread id or -1) of each thread state, newest first: both fields read
    with the next pointer, one read a thread state (a target may hold tens of thousands)."""
    interp = mem.u64(layout.runtime_addr + layout.interpreters_head)
    if interp == 0:
        return []
    native = layout.tstate_native_thread_id
    span = max(layout.tstate_next, native) + 8
    found: list[tuple[int, int]] = []
    tstate = mem.u64(interp + layout.interp_threads_head)
    seen: set[int] = set()
    while tstate and tstate not in seen and len(found) < MAX_THREADS:
        seen.add(tstate)
        head = mem.read(tstate, span)
        found.append((tstate, u64_at(head, native) if native >= 0 else -1))
        tstate = u64_at(head, layout.tstate_next)
    return found


@lru_cache(maxsize=1)
def _local_pthread_tid_offsets() -> tuple[int, ...]:
    """Offsets in our own ``struct pthread`` holding our tid (same libc as most targets)."""
    found: list[int] = []
    ident = threading.get_ident()
    native = threading.get_native_id()
    with contextlib.suppress(Exception):
        raw = ctypes.string_at(ident, 0x1000)
        want = struct.pack("<i", native)
        found = [off for off in range(0, len(raw) - 3, 4) if raw[off : off + 4] == want]
    return tuple(found)


def _pthread_tids(
    mem: ProcessMemory, layout: Layout, tstates: list[int], live: set[int]
) -> list[int]:
    """Kernel tid (target namespace) per thread state; -1 where it cannot be told."""
    pthreads = [mem.u64(t + layout.tstate_thread_id) for t in tstates]
    best: list[int] = []
    best_hits = 0
    for off in dict.fromkeys([_GLIBC_TID_OFFSET, *_local_pthread_tid_offsets()]):
        tids = []
        for p in pthreads:
            try:
                tids.append(mem.i32(p + off) if p else -1)
            except MemoryReadError:
                tids.append(-1)
        hits = sum(1 for t in tids if t in live)
        if hits > best_hits:
            best, best_hits = tids, hits
    # A thread state can briefly outlive its thread or not yet be bound to one, so a few
    # misses are normal; a wrong offset misses (nearly) all of them.
    if best_hits == 0 or 2 * best_hits < len(tstates):
        raise PyRuntimeUnsupported("cannot map 3.10 thread states (pthread_t) to kernel thread ids")
    return best


def thread_states(pid: int, layout: Layout) -> dict[int, int]:
    """Our-namespace tid -> PyThreadState address, for every thread the interpreter knows.

    Thread states whose thread has already exited (not yet unlinked) are left out.
    """
    with ProcessMemory(pid) as mem:
        return listed_thread_states(mem, layout, namespace_tids(pid))[1]


def listed_thread_states(
    mem: ProcessMemory, layout: Layout, live: dict[int, int]
) -> tuple[int, dict[int, int]]:
    """How many thread states the interpreter lists, and those of live threads by our tid, from
    one walk of its list."""
    try:
        listed = _tstates(mem, layout)
        tstates = [address for address, _ in listed]
        if layout.tstate_native_thread_id >= 0:
            inner = [native for _, native in listed]
        else:
            inner = _pthread_tids(mem, layout, tstates, set(live))
    except MemoryReadError as exc:
        raise PyRuntimeUnsupported(f"reading thread states failed: {exc}") from exc
    found = {live[tid]: t for tid, t in zip(inner, tstates, strict=True) if tid in live}
    return len(tstates), found
