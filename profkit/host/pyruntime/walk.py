"""Walking a thread's Python frames from outside the process, as the eBPF walker does."""

from __future__ import annotations

import time

from .code import CodeResolver
from .errors import MemoryReadError, PyRuntimeUnsupported
from .layout import Layout
from .memory import ProcessMemory, i32_at, u64_at
from .threads import listed_thread_states, namespace_tids

# Shim frames are skipped without counting; this bounds how many of them one walk tolerates.
MAX_SKIPPED = 64


def first_frame(mem: ProcessMemory, layout: Layout, tstate: int) -> int:
    frame = mem.u64(tstate + layout.tstate_frame)
    if layout.frame_kind == "cframe" and frame:
        frame = mem.u64(frame + layout.cframe_current_frame)
    return frame


def walk_frames(
    mem: ProcessMemory, layout: Layout, tstate: int, max_frames: int = 32, strict: bool = False
) -> list[tuple[int, int]]:
    """(code address, instruction index in code units), innermost first.

    One read per frame of ``layout.frame_span()`` bytes.  A frame that cannot be read ends the
    walk (as in the probe) unless ``strict``, which raises instead.
    """
    out: list[tuple[int, int]] = []
    span = layout.frame_span()
    skipped = 0
    try:
        frame = first_frame(mem, layout, tstate)
    except MemoryReadError:
        if strict:
            raise
        return out
    while frame and len(out) < max_frames and skipped <= MAX_SKIPPED:
        try:
            raw = mem.read(frame, span)
        except MemoryReadError:
            if strict:
                raise
            break
        code = u64_at(raw, layout.frame_code) & ~layout.code_tag  # 3.14: a tagged reference
        previous = u64_at(raw, layout.frame_previous)
        if layout.frame_kind == "frameobject":
            out.append((code, i32_at(raw, layout.frame_instr)))
        elif layout.owner_cstack >= 0 and raw[layout.frame_owner] >= layout.owner_cstack:
            # Entry shims pushed when C code calls into Python, and 3.14's interpreter-owned
            # frames (3.15's base frame among them): they run no user code.
            skipped += 1
        else:
            instr = u64_at(raw, layout.frame_instr)
            # Signed: a frame that has not started points one unit before its first instruction.
            out.append((code, (instr - code - layout.code_adaptive) // 2))
        frame = previous
    return out


def walk(pid: int, layout: Layout, tstate: int, max_frames: int = 256) -> list[tuple[int, int]]:
    """The frames of the thread whose PyThreadState is at ``tstate``, innermost first."""
    with ProcessMemory(pid) as mem:
        return walk_frames(mem, layout, tstate, max_frames)


def _table_units(layout: Layout, table: bytes) -> int:
    """Code units (3.11+) or bytes/2 (3.10) the line table covers."""
    if layout.version >= (3, 11):
        return sum((b & 7) + 1 for b in table if b & 0x80)
    return sum(table[0::2]) // 2


# Threads walked by one sweep of the self-check: enough to tell a wrong layout (every thread
# shows it), while a target's thread count, its own to choose, does not set how long it takes.
CHECKED_THREADS = 64


def self_check(pid: int, layout: Layout, attempts: int = 10, sweeps: int = 10) -> None:
    """Walk the threads from user space (the main thread and up to CHECKED_THREADS in all)
    and check the offsets produce real code objects.

    A thread that runs Python code while it is read can change its stack between two reads,
    so a thread's walk is retried up to ``attempts`` times, 2 ms apart.  A thread moving
    between C and Python code (an import running module bodies does so thousands of times a
    second) also shows no current frame for a moment, or a frame being torn down.  So a sweep
    over the threads that finds no Python frame, or a thread that never read consistently, is
    repeated up to ``sweeps`` times, 50 ms apart; the check fails, naming the last problem
    seen, only when no sweep succeeds.  Raises PyRuntimeUnsupported.
    """
    problem = ""
    for sweep in range(sweeps):
        if sweep:
            time.sleep(0.05)
        try:
            if _check_threads(pid, layout, attempts):
                return
            problem = "self-check: no thread has a Python frame"
        except _Inconsistent as exc:
            problem = str(exc)
    raise PyRuntimeUnsupported(problem)


class _Inconsistent(PyRuntimeUnsupported):
    """A thread whose stack never read consistently in one sweep: worth another sweep."""


def _check_threads(pid: int, layout: Layout, attempts: int) -> int:
    """Python frames found in one sweep over the target's threads."""
    live = namespace_tids(pid)
    with ProcessMemory(pid) as mem:
        try:
            listed, mapped = listed_thread_states(mem, layout, live)
        except PyRuntimeUnsupported as exc:
            raise PyRuntimeUnsupported(f"self-check: thread list unreadable: {exc}") from exc
        if not listed:
            raise PyRuntimeUnsupported("self-check: the interpreter lists no thread states")
        if not mapped:
            raise PyRuntimeUnsupported(
                f"self-check: none of {listed} thread states matches one of the "
                f"{len(live)} threads of pid {pid}"
            )
        resolver = CodeResolver(pid, layout, mem)
        frames = 0
        # The main thread first (the interpreter lists the newest first), then the newest.
        order = sorted(mapped.items(), key=lambda item: item[0] != pid)[:CHECKED_THREADS]
        for tid, tstate in order:
            problem = ""
            for attempt in range(attempts):
                if attempt:
                    time.sleep(0.002)
                try:
                    frames += _check_thread(mem, layout, resolver, tid, tstate)
                    break
                except PyRuntimeUnsupported as exc:
                    problem = str(exc)
            else:
                raise _Inconsistent(problem)
        return frames


def _check_thread(
    mem: ProcessMemory, layout: Layout, resolver: CodeResolver, tid: int, tstate: int
) -> int:
    try:
        stack = walk_frames(mem, layout, tstate, max_frames=256, strict=True)
    except MemoryReadError as exc:
        raise PyRuntimeUnsupported(f"self-check: thread {tid}: {exc}") from exc
    for code, index in stack:
        _check_frame(mem, layout, resolver, tid, code, index)
    return len(stack)


def _check_frame(
    mem: ProcessMemory, layout: Layout, resolver: CodeResolver, tid: int, code: int, index: int
) -> None:
    where = f"self-check: thread {tid}, code {code:#x}"
    try:
        ob_type = mem.u64(code + layout.ob_type)
    except MemoryReadError as exc:
        raise PyRuntimeUnsupported(f"{where}: unreadable: {exc}") from exc
    if ob_type != layout.code_type_addr:
        raise PyRuntimeUnsupported(
            f"{where}: type {ob_type:#x} is not PyCode_Type ({layout.code_type_addr:#x})"
        )
    info = resolver.resolve(code)
    table = resolver.linetable(code)
    if info is None or table is None:
        raise PyRuntimeUnsupported(f"{where}: name or line table unreadable")
    if not -1 <= index < _table_units(layout, table):
        raise PyRuntimeUnsupported(
            f"{where} ({info.qualname}): instruction {index} outside its line table"
        )
    if resolver.line(code, index) is None and index >= 0:
        # Only artificial instructions lack a line, and a suspended frame never rests on one.
        raise PyRuntimeUnsupported(f"{where} ({info.qualname}): no line for instruction {index}")
