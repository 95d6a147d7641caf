"""Where a function returns: the `ret` instructions reached from its entry, tail calls followed.

A uretprobe rewrites the return address on the thread's stack to a trampoline. py-spy --native
unwinds the main thread through that address while it is inside GOMP_parallel, and each of its
samples then holds the target stopped longer: measured on 2 cores (fan-out recipe, 8 threads),
py-spy with the uretprobe cost 7% of copies/s, without it 0-1%. A plain uprobe on each `ret`
marks the same moment without touching the stack.

libgomp's GOMP_parallel ends in `jmp GOMP_parallel_end`, which itself may `jmp` into a static
gomp_team_end, so returns are collected across tail jumps; function extents come from the
.eh_frame FDEs, which cover static functions that have no symbol. A tail jump into the PLT
leaves the library for good (Debian's libgomp1 ends gomp_team_end in `jmp free@plt`): the jump
itself is then the exit, and a direct jump is cheap to probe. Any other jump that cannot be
followed (indirect, or to code without an FDE) makes the answer None: the caller then falls back
to a uretprobe rather than miss a return.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import lru_cache

FDE_RANGE = re.compile(r"pc=([0-9a-f]+)\.\.([0-9a-f]+)")
INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
DIRECT_JUMP = re.compile(r"^(?:bnd\s+)?j[a-z]+\s+([0-9a-f]+)\b")
MAX_FUNCTIONS = 8


# What a failed or missing binutils tool raises here.
TOOL_ERRORS = (subprocess.CalledProcessError, OSError)


SECTION = re.compile(r"\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)")
PLT_SECTIONS = (".plt", ".plt.got", ".plt.sec")


def _output(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, errors="replace").stdout


def _identity(path: str) -> tuple[str, int, int]:
    """A file's identity for the caches below: a replaced library is read again."""
    st = os.stat(path)
    return path, st.st_size, st.st_mtime_ns


# A library's tables are read once per process: several entry points of one runtime, and the
# probe points beside them, all look in the same tables (an OpenBLAS build's frame table is
# megabytes of text).
@lru_cache(maxsize=16)
def _extents(path: str, size: int, mtime_ns: int) -> tuple[tuple[int, int], ...]:
    text = _output("readelf", "--debug-dump=frames", path)
    return tuple(sorted((int(a, 16), int(b, 16)) for a, b in FDE_RANGE.findall(text)))


@lru_cache(maxsize=16)
def _functions(path: str, size: int, mtime_ns: int) -> dict[str, int]:
    """Every function symbol (dynamic and, where present, static) by name."""
    functions: dict[str, int] = {}
    for line in _output("readelf", "-Ws", "--dyn-syms", path).splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[3] == "FUNC":
            functions.setdefault(fields[7].split("@")[0], int(fields[1], 16))
    return functions


@lru_cache(maxsize=16)
def _plt(path: str, size: int, mtime_ns: int) -> tuple[tuple[int, int], ...]:
    """Address ranges of the PLT sections: stubs that jump to other libraries."""
    ranges = []
    for line in _output("readelf", "-SW", path).splitlines():
        match = SECTION.search(line)
        if match and match.group(1) in PLT_SECTIONS:
            start, length = int(match.group(2), 16), int(match.group(3), 16)
            ranges.append((start, start + length))
    return tuple(sorted(ranges))


def plt_ranges(path: str) -> list[tuple[int, int]]:
    return list(_plt(*_identity(path)))


def is_return(instruction: str) -> bool:
    mnemonic = instruction.split()[0] if instruction else ""
    return mnemonic in ("ret", "retq") or instruction.startswith(("rep ret", "repz ret"))


def function_extents(path: str) -> list[tuple[int, int]]:
    return list(_extents(*_identity(path)))


def function_symbols(path: str) -> dict[str, int]:
    return _functions(*_identity(path))


def symbol_address(path: str, symbol: str) -> int | None:
    return function_symbols(path).get(symbol)


def extent_of(address: int, extents: list[tuple[int, int]]) -> tuple[int, int] | None:
    for start, end in extents:
        if start <= address < end:
            return start, end
    return None


def disassemble(path: str, start: int, end: int) -> list[tuple[int, str]]:
    text = _output(
        "objdump",
        "-d",
        "--no-show-raw-insn",
        f"--start-address={start:#x}",
        f"--stop-address={end:#x}",
        path,
    )
    found = []
    for line in text.splitlines():
        match = INSTRUCTION.match(line)
        if match:
            found.append((int(match.group(1), 16), match.group(2).strip()))
    return found


def return_sites(path: str, symbol: str) -> list[int] | None:
    """Virtual addresses of every `ret` reached from `symbol`, and of every tail jump from there
    into the PLT; None when unsure."""
    try:
        entry = symbol_address(path, symbol)
        extents = function_extents(path)
        plt = plt_ranges(path)
    except TOOL_ERRORS:
        return None
    if entry is None:
        return None
    pending, seen, returns = [entry], set(), []
    while pending:
        extent = extent_of(pending.pop(), extents)
        if extent is None:
            return None
        if extent in seen:
            continue
        seen.add(extent)
        if len(seen) > MAX_FUNCTIONS:
            return None
        try:
            code = disassemble(path, *extent)
        except TOOL_ERRORS:
            return None
        for address, instruction in code:
            mnemonic = instruction.split()[0] if instruction else ""
            if is_return(instruction):
                returns.append(address)
            elif mnemonic.startswith("j"):
                jump = DIRECT_JUMP.match(instruction)
                if jump is None:
                    return None  # an indirect jump: it may leave the function
                target = int(jump.group(1), 16)
                if extent_of(target, plt) is not None:
                    returns.append(address)  # a tail call out of the library
                elif not extent[0] <= target < extent[1]:
                    pending.append(target)
    return sorted(returns) or None
