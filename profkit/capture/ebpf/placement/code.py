"""Where a function returns: the `ret` instructions reached from its entry, tail calls followed.

A uretprobe rewrites the return address on the thread's stack to a trampoline. py-spy --native
unwinds the main thread through that address while it is inside GOMP_parallel, and each of its
samples then holds the target stopped longer, py-spy beside a uretprobe costing the target
several times what it does without one (docs/results/ebpf-cost.md#why-no-uretprobe). A plain
uprobe on each `ret` marks the same moment without touching the stack.

libgomp's GOMP_parallel ends in `jmp GOMP_parallel_end`, which itself may `jmp` into a static
gomp_team_end, so returns are collected across tail jumps; function extents come from the
.eh_frame FDEs, which cover static functions that have no symbol. A tail jump into the PLT
leaves the library for good (Debian's libgomp1 ends gomp_team_end in `jmp free@plt`): the jump
itself is then the exit, and a direct jump is cheap to probe. Any other jump that cannot be
followed (indirect, or to code without an FDE) makes the answer None: the caller then falls back
to a uretprobe rather than miss a return. An indirect jump marked `notrack` is a switch's jump
table, which compilers building with CET mark so: its targets lie inside the function.

The file is read in-process, without binutils, by profkit's one ELF reader (host/elf.py: the
sections and the symbol tables, local .symtab ones too, such as OpenBLAS's exec_blas), the
unwind tables' ranges by frames.py, and the code decoded by capstone, x86-64 and aarch64. On
another machine, or where capstone cannot load, the answer is None, as it was where readelf and
objdump were missing.
"""

from __future__ import annotations

import bisect
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import IO, Any, BinaryIO

from ....host.elf import (
    EM_AARCH64,
    EM_X86_64,
    SHF_EXECINSTR,
    SHT_NOBITS,
    STT_FUNC,
    ElfFile,
    read_headers,
    read_symbol_tables,
)
from .frames import fde_ranges

MAX_FUNCTIONS = 8
PLT_SECTIONS = (".plt", ".plt.got", ".plt.sec")

# What an instruction does to the flow of control.
RET = "ret"
JUMP = "jump"  # target: a direct jump's destination; None: an indirect jump
TABLE = "table"  # an indirect jump through a switch's jump table (`notrack jmp *%rax`)
CALL = "call"  # target as for JUMP
ENDBR = "endbr"  # endbr64, the first instruction of a function built with CET
OTHER = "other"


class UnreadableCode(ValueError):
    """The file cannot be read as code here: not an ELF file, malformed tables, or an
    architecture without a decoder."""


# What reading a runtime's code can raise here; each means "no answer", never a crash: the
# file is whatever the target mapped. ImportError: capstone's compiled library did not load.
TOOL_ERRORS = (OSError, UnreadableCode, ImportError)


@dataclass(frozen=True)
class Instruction:
    address: int
    text: str  # as capstone prints it, AT&T syntax on x86: "pushq %r13", "jne 0x1cb60"
    kind: str = OTHER
    target: int | None = None  # where a direct jump or call goes
    # The x86 kernel runs a uprobe on it inside the trap instead of single-stepping it: a push
    # of a general register, a direct jmp, jcc or call, a nop (probe_points.py).
    emulated: bool = False


# The ELF machines whose code is decoded, by the names messages give them.
MACHINES = {"EM_X86_64": "x86-64", "EM_AARCH64": "aarch64"}


def _identity(path: str) -> tuple[str, int, int, tuple[int, int]]:
    """A file's identity for the caches below: a replaced library is read again, and a path
    that reaches another file since (a mapped file's, host/mapped.py) is another key."""
    st = os.stat(path)
    return path, st.st_size, st.st_mtime_ns, (st.st_dev, st.st_ino)


@contextmanager
def _open(path: str) -> Iterator[BinaryIO]:
    """The file, when it is a regular one: a device or FIFO under a runtime's name is refused
    before it is read (O_NONBLOCK so that the open itself cannot block)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UnreadableCode(f"{path}: not a regular file")
        yield f


@contextmanager
def _elf(path: str) -> Iterator[tuple[BinaryIO, ElfFile]]:
    """The file and its headers (host/elf.py, profkit's one ELF reader); a file that is not a
    64-bit little-endian ELF, or whose tables lie past its end, is UnreadableCode."""
    with _open(path) as f:
        try:
            elf = read_headers(f)
        except (ValueError, struct.error) as exc:
            raise UnreadableCode(f"{path}: {exc}") from exc
        if elf is None:
            raise UnreadableCode(f"{path}: not a 64-bit little-endian ELF file")
        yield f, elf


def _section_bytes(f: IO[bytes], offset: int, size: int) -> bytes:
    data = os.pread(f.fileno(), size, offset)
    if len(data) != size:
        raise UnreadableCode("a section past the end of the file")
    return data


# A library's tables are read once per process: several entry points of one runtime, and the
# probe points beside them, all look in the same tables (an OpenBLAS build has 11 700 FDEs).
@lru_cache(maxsize=16)
def _extents(
    path: str, size: int, mtime_ns: int, file_id: tuple[int, int]
) -> tuple[tuple[int, int], ...]:
    """The address range of every FDE, in .eh_frame and (unstripped builds) .debug_frame."""
    ranges: list[tuple[int, int]] = []
    with _elf(path) as (f, elf):
        for name, eh_frame in ((".eh_frame", True), (".debug_frame", False)):
            section = elf.section(name)
            if section is None or section.type == SHT_NOBITS or section.size > MAX_FRAME_BYTES:
                continue
            data = _section_bytes(f, section.offset, section.size)
            try:
                ranges += fde_ranges(data, section.addr, eh_frame)
            except (ValueError, IndexError, struct.error) as exc:
                raise UnreadableCode(f"{path}: {name}: {exc}") from exc
    return tuple(sorted(ranges))


# Unwind tables past this are not read: a crafted file can claim any size.
MAX_FRAME_BYTES = 64 << 20


@lru_cache(maxsize=16)
def _symbols(
    path: str, size: int, mtime_ns: int, file_id: tuple[int, int]
) -> tuple[dict[str, int], tuple[tuple[int, int], ...]]:
    """Every defined function symbol (dynamic, then, where present, static) by name, the first
    of a name kept; and the extents of those with a size, sorted. The tables are read as arrays
    (host/elf.py); each function's name is cut from its string table."""
    functions: dict[str, int] = {}
    sized: set[tuple[int, int]] = set()
    with _elf(path) as (f, elf):
        try:
            tables = read_symbol_tables(f, elf)
        except ValueError as exc:
            raise UnreadableCode(f"{path}: {exc}") from exc
        for table in tables:
            symbols = table.symbols[(table.symbols["info"] & 0xF) == STT_FUNC]
            if table.strings_size > MAX_STRING_BYTES:
                raise UnreadableCode(f"{path}: a string table of {table.strings_size} bytes")
            strings = _section_bytes(f, table.strings_at, table.strings_size)
            for name_at, value, length in zip(
                symbols["name"].tolist(),
                symbols["value"].tolist(),
                symbols["size"].tolist(),
                strict=True,
            ):
                if length:
                    sized.add((value, value + length))
                end = strings.find(b"\0", name_at)
                name = strings[name_at : end if end >= 0 else None].decode(errors="replace")
                # A static table may spell a versioned definition "name@VERSION".
                if name := name.split("@")[0]:
                    functions.setdefault(name, value)
    return functions, tuple(sorted(sized))


# A string table past this is not read (a runtime's is well under a megabyte; libtorch's,
# never probed, some tens).
MAX_STRING_BYTES = 64 << 20


def _functions(path: str, size: int, mtime_ns: int, file_id: tuple[int, int]) -> dict[str, int]:
    return _symbols(path, size, mtime_ns, file_id)[0]


@lru_cache(maxsize=16)
def _plt(
    path: str, size: int, mtime_ns: int, file_id: tuple[int, int]
) -> tuple[tuple[int, int], ...]:
    """Address ranges of the PLT sections: stubs that jump to other libraries."""
    with _elf(path) as (_, elf):
        return tuple(
            sorted((s.addr, s.addr + s.size) for s in elf.sections if s.name in PLT_SECTIONS)
        )


@lru_cache(maxsize=16)
def _code(
    path: str, size: int, mtime_ns: int, file_id: tuple[int, int]
) -> tuple[str, bool, tuple[tuple[int, int, int], ...]]:
    """The machine, its byte order, and the executable sections as (address, end, offset)."""
    with _elf(path) as (_, elf):
        sections = tuple(
            (s.addr, s.addr + s.size, s.offset)
            for s in elf.sections
            if s.flags & SHF_EXECINSTR and s.type != SHT_NOBITS
        )
        return MACHINE_NAMES.get(elf.machine, str(elf.machine)), True, sections


MACHINE_NAMES = {EM_X86_64: "EM_X86_64", EM_AARCH64: "EM_AARCH64"}


def plt_ranges(path: str) -> list[tuple[int, int]]:
    return list(_plt(*_identity(path)))


def function_extents(path: str) -> list[tuple[int, int]]:
    return list(_extents(*_identity(path)))


def function_symbols(path: str) -> dict[str, int]:
    return _functions(*_identity(path))


def symbol_address(path: str, symbol: str) -> int | None:
    return function_symbols(path).get(symbol)


def file_offset(path: str, address: int) -> int:
    """Where an address of the file's code lies in the file, as the CO-RE loader's uprobes take
    it (bcc converts its `addr` itself)."""
    for start, end, offset in _code(*_identity(path))[2]:
        if start <= address < end:
            return address - start + offset
    raise UnreadableCode(f"{path}: {address:#x} is in no executable section")


def extent_at(path: str, address: int) -> tuple[int, int] | None:
    """The function holding an address: from the symbol tables' sizes where a symbol covers it,
    else from the unwind tables (a stripped local function). Reading every FDE of a large
    library (OpenBLAS has 11 700) costs about a second, so they are read only when needed."""
    sized = _symbols(*_identity(path))[1]
    at = bisect.bisect_right(sized, (address, 1 << 64)) - 1
    if at >= 0 and sized[at][0] <= address < sized[at][1]:
        return sized[at]
    return extent_of(address, function_extents(path))


def extent_of(address: int, extents: list[tuple[int, int]]) -> tuple[int, int] | None:
    for start, end in extents:
        if start <= address < end:
            return start, end
    return None


def disassemble(path: str, start: int, end: int) -> list[Instruction]:
    """The instructions from start to end (clipped to the executable section that holds start);
    none where no such section does."""
    machine, little_endian, sections = _code(*_identity(path))
    for address, stop, offset in sections:
        if address <= start < stop:
            with _open(path) as f:
                f.seek(offset + start - address)
                code = f.read(max(0, min(end, stop) - start))
            try:
                return decode(machine, code, start, little_endian)
            except UnreadableCode as exc:
                raise UnreadableCode(f"{path}: {exc}") from None
    return []


def _capstone() -> Any:
    """capstone, imported on first use: where its compiled library does not load, the ImportError
    makes the answers None, as missing binutils did."""
    import capstone  # type: ignore[import-untyped]  # no py.typed

    return capstone


def decode(
    machine: str, code: bytes, address: int, little_endian: bool = True
) -> list[Instruction]:
    """The instructions of `code`, loaded at `address`, for an ELF e_machine ("EM_X86_64")."""
    cs = _capstone()
    if machine == "EM_X86_64":
        arch, mode, classify = cs.CS_ARCH_X86, cs.CS_MODE_64, _x86
    elif machine == "EM_AARCH64":
        arch = getattr(cs, "CS_ARCH_ARM64", None) or getattr(cs, "CS_ARCH_AARCH64", None)
        mode = cs.CS_MODE_ARM | (0 if little_endian else cs.CS_MODE_BIG_ENDIAN)
        classify = _aarch64
    else:
        raise UnreadableCode(f"only x86-64 and aarch64 code is decoded (ELF machine {machine})")
    if arch is None or not cs.cs_support(arch):
        raise UnreadableCode(f"capstone {cs.__version__} has no {MACHINES[machine]} decoder")
    # One decoder per call: the collector reads several runtimes from threads at once, and
    # capstone's calls run outside the GIL on a handle that is not to be shared.
    decoder = cs.Cs(arch, mode)
    decoder.detail = True
    decoder.skipdata = True  # bytes that decode to nothing are skipped, as objdump's "(bad)"
    if arch == cs.CS_ARCH_X86:
        decoder.syntax = cs.CS_OPT_SYNTAX_ATT
    return [classify(cs, insn) for insn in decoder.disasm(code, address)]


NOTRACK = 0x3E  # the prefix that exempts an indirect jump from CET's branch tracking


def _x86(cs: Any, insn: Any) -> Instruction:
    x86 = cs.x86_const
    text = f"{insn.mnemonic} {insn.op_str}".strip()
    if insn.id == 0:  # bytes skipped (skipdata): nothing else can be asked of them
        return Instruction(insn.address, text)
    if insn.id == x86.X86_INS_RET:
        return Instruction(insn.address, text, RET)
    if insn.id == x86.X86_INS_ENDBR64:
        return Instruction(insn.address, text, ENDBR)
    operands = insn.operands
    target = operands[0].imm if operands and operands[0].type == x86.X86_OP_IMM else None
    # The kernel emulates jumps and calls by opcode: jmp, jcc and call with a relative target,
    # never with a 0x66 prefix, never jrcxz or loop (arch/x86/kernel/uprobes.c).
    relative = target is not None and 0x66 not in insn.prefix
    if insn.group(cs.CS_GRP_JUMP):
        if target is None and NOTRACK in insn.prefix:
            return Instruction(insn.address, text, TABLE)
        counted = insn.id not in (x86.X86_INS_JRCXZ, x86.X86_INS_JECXZ, x86.X86_INS_JCXZ)
        return Instruction(insn.address, text, JUMP, target, relative and counted)
    if insn.group(cs.CS_GRP_CALL):
        return Instruction(insn.address, text, CALL, target, relative)
    if insn.id == x86.X86_INS_PUSH:
        pushed = operands[0].reg if operands and operands[0].type == x86.X86_OP_REG else None
        return Instruction(insn.address, text, emulated=pushed in _general_registers(cs))
    return Instruction(insn.address, text, emulated=insn.id == x86.X86_INS_NOP)


# The registers whose push the kernel emulates (opcodes 0x50-0x57, with REX.B for r8-r15).
GENERAL_REGISTERS: tuple[str, ...] = ("RAX", "RBX", "RCX", "RDX", "RSI", "RDI", "RBP", "RSP")
GENERAL_REGISTERS += tuple(f"R{n}" for n in range(8, 16))


@lru_cache(maxsize=1)
def _general_registers(cs: Any) -> frozenset[int]:
    return frozenset(getattr(cs.x86_const, f"X86_REG_{name}") for name in GENERAL_REGISTERS)


AARCH64_RETURNS = {"ret", "retaa", "retab"}
AARCH64_JUMPS = {"b", "cbz", "cbnz", "tbz", "tbnz", "br", "braa", "brab", "braaz", "brabz"}
AARCH64_CALLS = {"bl", "blr", "blraa", "blrab", "blraaz", "blrabz"}


def _aarch64(cs: Any, insn: Any) -> Instruction:
    """Returns, jumps and calls by mnemonic; a direct one's target is its last operand. Nothing
    is claimed emulated: the costs in probe_points.py are the x86 kernel's."""
    text = f"{insn.mnemonic} {insn.op_str}".strip()
    mnemonic = insn.mnemonic
    if insn.id == 0:
        return Instruction(insn.address, text)
    if mnemonic in AARCH64_RETURNS:
        return Instruction(insn.address, text, RET)
    if mnemonic in AARCH64_JUMPS or mnemonic.startswith("b."):
        kind = JUMP
    elif mnemonic in AARCH64_CALLS:
        kind = CALL
    else:
        return Instruction(insn.address, text)
    last = insn.operands[-1] if insn.operands else None
    target = last.imm if last is not None and last.type == cs.CS_OP_IMM else None
    return Instruction(insn.address, text, kind, target)


def return_sites(path: str, symbol: str) -> list[int] | None:
    """Virtual addresses of every `ret` reached from `symbol`, and of every tail jump from there
    into the PLT; None when unsure."""
    try:
        entry = symbol_address(path, symbol)
        plt = plt_ranges(path)
    except TOOL_ERRORS:
        return None
    if entry is None:
        return None
    pending, seen, returns = [entry], set(), []
    while pending:
        try:
            extent = extent_at(path, pending.pop())
        except TOOL_ERRORS:
            return None
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
        for instruction in code:
            if instruction.kind == RET:
                returns.append(instruction.address)
            elif instruction.kind == JUMP:
                target = instruction.target
                if target is None:
                    return None  # an indirect jump: it may leave the function
                if extent_of(target, plt) is not None:
                    returns.append(instruction.address)  # a tail call out of the library
                elif not extent[0] <= target < extent[1]:
                    pending.append(target)
    return sorted(returns) or None
