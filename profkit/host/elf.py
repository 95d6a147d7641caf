"""ELF64 (little-endian) headers and symbol tables, read as numpy arrays.

profkit reads ELF in two ways. Sections, code and unwind tables go through pyelftools and
capstone (capture/ebpf/returns.py), where a few records of one function are wanted. Symbol
tables come from here, for both of their uses: naming native frames (host/symbols.py) and
finding the interpreter's symbols (host/pyruntime/). A library such as libtorch holds half a
million symbols, which pyelftools decodes one record at a time and numpy reads as one array
(docs/results/memory-and-speed.md#reading-symbol-tables). Only the headers, one symbol table and,
for a name looked up, its string table are read: never the code.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

SYMBOL = np.dtype(
    [
        ("name", "<u4"),
        ("info", "u1"),
        ("other", "u1"),
        ("shndx", "<u2"),
        ("value", "<u8"),
        ("size", "<u8"),
    ]
)
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
PT_LOAD = 1
SHT_SYMTAB, SHT_DYNSYM = 2, 11
ET_EXEC = 2
STT_FUNC, STT_GNU_IFUNC = 2, 10
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK = 1, 2
EM_X86_64 = 62
EM_AARCH64 = 183
# Larger than any interpreter or runtime build with its symbols; a file past it is not read.
MAX_ELF_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Load:
    """One PT_LOAD segment: where its bytes lie in the file and where it is meant to map."""

    offset: int
    file_size: int
    vaddr: int
    align: int


@dataclass(frozen=True)
class SymbolTable:
    """One file's defined symbols, from .symtab where the file keeps it, else .dynsym (the two
    agree on every symbol both hold), with the file's segments and type."""

    machine: int
    is_exec: bool  # ET_EXEC: addresses are absolute, no load bias
    loads: tuple[Load, ...]
    symbols: np.ndarray  # SYMBOL records, defined ones only (a section and a name)
    strings_at: int  # the string table the names index, in the file
    strings_size: int

    @property
    def first_load_vaddr(self) -> int:
        """The page-aligned vaddr of the segment that maps file offset 0."""
        for load in self.loads:
            if load.offset == 0:
                return load.vaddr & ~(max(load.align, 1) - 1)
        return 0

    def functions(self) -> np.ndarray:
        """The function symbols with an address, sorted by it."""
        kind = self.symbols["info"] & 0xF
        keep = ((kind == STT_FUNC) | (kind == STT_GNU_IFUNC)) & (self.symbols["value"] != 0)
        found = self.symbols[keep]
        return found[np.argsort(found["value"], kind="stable")]

    def strings(self, f: BinaryIO) -> bytes:
        """The string table the names index."""
        return _read(f, self.strings_at, self.strings_size, os.fstat(f.fileno()).st_size)

    def lookup(self, strings: bytes, name: str) -> tuple[int, int] | None:
        """(value, size) of the symbol called `name`, None where the table has none. Names may
        share a tail, so a match is a symbol whose name offset is where `name` and its NUL lie,
        not any place the bytes occur."""
        wanted = name.encode() + b"\0"
        offsets = []
        at = strings.find(wanted)
        while at >= 0:
            offsets.append(at)
            at = strings.find(wanted, at + 1)
        hits = self.symbols[np.isin(self.symbols["name"], np.array(offsets, np.uint32))]
        if not len(hits):
            return None
        # A global or weak definition before a local one of the same name (locals come first).
        bound = hits[np.isin(hits["info"] >> 4, (STB_GLOBAL, STB_WEAK))]
        hit = bound[0] if len(bound) else hits[0]
        return int(hit["value"]), int(hit["size"])


def open_elf(path: str) -> BinaryIO | None:
    """The file opened for reading, or None where it is not a regular file of bounded size: the
    target chose what it mapped, and a device or FIFO under a library's name is refused before
    it is read (O_NONBLOCK, so that the open itself cannot block). OSError where it cannot be
    opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    f = os.fdopen(fd, "rb")
    try:
        info = os.fstat(f.fileno())
    except OSError:
        f.close()
        raise
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ELF_BYTES:
        f.close()
        return None
    return f


def read_symbol_table(f: BinaryIO) -> SymbolTable | None:
    """None where the file is not a 64-bit little-endian ELF; ValueError where its tables lie
    past its end."""
    file_size = os.fstat(f.fileno()).st_size
    head = _read(f, 0, _EHDR.size, file_size)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    header = _EHDR.unpack(head)
    e_type, machine, e_phoff, e_shoff = header[1], header[2], header[5], header[6]
    e_phentsize, e_phnum, e_shentsize, e_shnum = header[9], header[10], header[11], header[12]
    if (e_phnum and e_phentsize < _PHDR.size) or (e_shnum and e_shentsize < _SHDR.size):
        raise ValueError("headers smaller than ELF64's")
    program = _read(f, e_phoff, e_phentsize * e_phnum, file_size)
    loads = []
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, p_align = _PHDR.unpack_from(
            program, i * e_phentsize
        )
        if p_type == PT_LOAD:
            loads.append(Load(p_offset, p_filesz, p_vaddr, p_align))
    table = _read(f, e_shoff, e_shentsize * e_shnum, file_size)
    sections = [_SHDR.unpack_from(table, i * e_shentsize) for i in range(e_shnum)]
    for wanted in (SHT_SYMTAB, SHT_DYNSYM):
        for _, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
            if sh_type != wanted or sh_entsize != SYMBOL.itemsize or sh_link >= len(sections):
                continue
            raw = _read(f, sh_offset, sh_size, file_size)
            symbols = np.frombuffer(raw, SYMBOL, len(raw) // SYMBOL.itemsize)
            symbols = symbols[(symbols["shndx"] != SHN_UNDEF) & (symbols["name"] != 0)]
            strings_at, strings_size = sections[sh_link][4], sections[sh_link][5]
            if strings_at + strings_size > file_size:
                raise ValueError("a string table past the end of the file")
            return SymbolTable(
                machine, e_type == ET_EXEC, tuple(loads), symbols, strings_at, strings_size
            )
    empty = np.zeros(0, SYMBOL)
    return SymbolTable(machine, e_type == ET_EXEC, tuple(loads), empty, 0, 0)


def _read(f: BinaryIO, offset: int, size: int, file_size: int) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ValueError("a table past the end of the file")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("the file ended inside a table")  # it shrank while being read
    return data
