"""profkit.host.pyruntime read from inside this very process: line tables, memory reads, a
frame walk of another thread and the code resolver's cache."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from profkit.host.pyruntime import CodeInfo, CodeResolver, detect, thread_states, walk
from profkit.host.pyruntime.linetable import iter_entries_311, iter_ranges_310, line_for
from profkit.host.pyruntime.memory import ProcessMemory


def test_memory_reads_self() -> None:
    data = b"profkit-pyruntime"
    buf = __import__("ctypes").create_string_buffer(data)
    addr = __import__("ctypes").addressof(buf)
    with ProcessMemory(os.getpid()) as mem:
        assert mem.read(addr, len(data)) == data
        with pytest.raises(OSError, match="not mapped"):
            mem.read(8, 8)


def _all_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_code(const)


def test_linetable_decoder_matches_this_interpreter() -> None:
    import inspect

    checked = 0
    for module in (inspect, threading, json.decoder):
        filename = module.__file__
        assert filename is not None
        source = Path(filename).read_text()
        for code in _all_code(compile(source, filename, "exec")):
            version = sys.version_info[:2]
            expected: list[int | None]  # the line of each instruction
            if sys.version_info >= (3, 11):
                decoded = [
                    pos
                    for start, end, pos in iter_entries_311(code.co_linetable, code.co_firstlineno)
                    for _ in range(end - start)
                ]
                assert decoded == list(code.co_positions()), code.co_qualname
                expected = [pos[0] for pos in code.co_positions()]
            else:
                ranges = list(iter_ranges_310(code.co_linetable, code.co_firstlineno))
                assert ranges == list(code.co_lines()), code.co_name
                expected = [None] * (len(code.co_code) // 2)
                for start, end, line in code.co_lines():
                    for offset in range(start, end, 2):
                        expected[offset // 2] = line
            for index, line in enumerate(expected):
                assert line_for(version, code.co_linetable, code.co_firstlineno, index) == line
            checked += 1
    assert checked > 300


def test_linetable_310_format() -> None:
    # (2 bytes, +1 line), (4 bytes, no line), (0 bytes, +2 lines), (2 bytes, +0)
    table = bytes([2, 1, 4, 0x80, 0, 2, 2, 0])
    assert list(iter_ranges_310(table, 10)) == [(0, 2, 11), (2, 6, None), (6, 8, 13)]
    assert line_for((3, 10), table, 10, 0) == 11
    assert line_for((3, 10), table, 10, 2) is None
    assert line_for((3, 10), table, 10, 3) == 13
    assert line_for((3, 10), table, 10, -1) == 10


def _park(parked: threading.Event, release: threading.Event) -> None:
    parked.set()
    release.wait()  # at:park


def test_walk_thread_of_this_process() -> None:
    """Another thread of this very process (a thread cannot walk itself: its stack moves)."""
    layout = detect(os.getpid())
    assert layout.version == sys.version_info[:2]
    parked, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_park, args=(parked, release), daemon=True)
    thread.start()
    try:
        parked.wait()
        assert thread.native_id is not None
        park_line = next(
            number
            for number, text in enumerate(Path(__file__).read_text().splitlines(), start=1)
            if text.endswith("# at:park")
        )
        resolver = CodeResolver(os.getpid(), layout)
        deadline = time.monotonic() + 10
        while True:
            tstate = thread_states(os.getpid(), layout)[thread.native_id]
            mine = []
            for code, index in walk(os.getpid(), layout, tstate):
                info = resolver.resolve(code)
                assert info is not None
                if info.filename == __file__:
                    mine.append((info.name, resolver.line(code, index)))
            if mine == [("_park", park_line)] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert mine == [("_park", park_line)]
    finally:
        release.set()
        thread.join()


def test_resolver_drops_reused_address() -> None:
    """A code object replaced at the same address (freed, memory reused) is re-read."""
    import ctypes

    layout = detect(os.getpid())
    resolver = CodeResolver(os.getpid(), layout)
    code = compile("x = 1\ny = 2\n", "<reused>", "exec")
    addr = id(code)
    first = resolver.resolve(addr)
    assert first == CodeInfo("<reused>", "<module>", "<module>", 1)
    assert resolver.resolve(addr) is first  # cached
    # Stand-in for a new code object at the same address: only the identity fields change.
    firstlineno = ctypes.c_int.from_address(addr + layout.code_firstlineno)
    firstlineno.value = 40
    try:
        again = resolver.resolve(addr)
        assert again is not None and again.firstlineno == 40
        assert resolver.line(addr, 0) is not None
    finally:
        firstlineno.value = 1
    assert resolver.resolve(addr) == first
