"""ELF64 (little-endian) headers, sections and symbol tables, symbol tables read as numpy
arrays: profkit's one ELF reader.

Every reader of ELF goes through here: naming native frames (host/symbols.py), finding the
interpreter's symbols (host/pyruntime/), placing the region probes (capture/ebpf/placement/: the
symbols, the executable sections, the PLT and the unwind tables' sections, whose ranges
placement/frames.py reads) and the loader of profkit's own object. A library such as libtorch
holds half a million symbols, which a record-at-a-time reader decodes slowly and numpy reads as
one array (docs/results/memory-and-speed.md#reading-symbol-tables). Only the headers, the tables
asked for and, for a name looked up, its string table are read: never the code.
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


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


SHF_EXECINSTR = 0x4
SHT_NOBITS = 8


def sections_of(data: bytes) -> list[Section]:
    """The section headers of an ELF64 little-endian image held in memory (an object profkit
    ships, or a part of a file read whole), with their names; ValueError where it is not one."""
    if data[:4] != b"\x7fELF" or len(data) < _EHDR.size or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF image")
    header = _EHDR.unpack_from(data)
    e_shoff, e_shentsize, e_shnum, e_shstrndx = header[6], header[11], header[12], header[13]
    if e_shnum and e_shentsize < _SHDR.size:
        raise ValueError("section headers smaller than ELF64's")
    table = _slice(data, e_shoff, e_shentsize * e_shnum)
    raw = [_SHDR.unpack_from(table, i * e_shentsize) for i in range(e_shnum)]
    if e_shnum and not 0 <= e_shstrndx < e_shnum:
        raise ValueError("no section names")
    names = _slice(data, raw[e_shstrndx][4], raw[e_shstrndx][5]) if e_shnum else b""
    found = []
    for sh_name, sh_type, flags, addr, offset, size, link, info, _align, entsize in raw:
        end = names.find(b"\0", sh_name)
        name = names[sh_name : end if end >= 0 else None].decode(errors="replace")
        found.append(Section(name, sh_type, flags, addr, offset, size, link, info, entsize))
    return found


def section_data(data: bytes, name: str) -> bytes | None:
    """The bytes of the named section of an ELF image in memory; None where it has none."""
    for section in sections_of(data):
        if section.name == name:
            return (
                None if section.type == SHT_NOBITS else _slice(data, section.offset, section.size)
            )
    return None


def _slice(data: bytes, offset: int, size: int) -> bytes:
    if offset < 0 or size < 0 or offset + size > len(data):
        raise ValueError("a table past the end of the image")
    return data[offset : offset + size]


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


@dataclass(frozen=True)
class ElfFile:
    """An ELF64 file's header facts and section headers, named."""

    machine: int
    is_exec: bool
    loads: tuple[Load, ...]
    sections: tuple[Section, ...]

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)


def read_headers(f: BinaryIO) -> ElfFile | None:
    """None where the file is not a 64-bit little-endian ELF; ValueError where its tables lie
    past its end."""
    file_size = os.fstat(f.fileno()).st_size
    head = _read(f, 0, _EHDR.size, file_size)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    header = _EHDR.unpack(head)
    e_type, machine, e_phoff, e_shoff = header[1], header[2], header[5], header[6]
    e_phentsize, e_phnum, e_shentsize, e_shnum = header[9], header[10], header[11], header[12]
    e_shstrndx = header[13]
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
    raw = [_SHDR.unpack_from(table, i * e_shentsize) for i in range(e_shnum)]
    names = b""
    if 0 < e_shstrndx < e_shnum and raw[e_shstrndx][1] != SHT_NOBITS:
        names = _read(f, raw[e_shstrndx][4], min(raw[e_shstrndx][5], MAX_NAMES), file_size)
    sections = []
    for sh_name, sh_type, flags, addr, offset, size, link, info, _align, entsize in raw:
        end = names.find(b"\0", sh_name)
        name = names[sh_name : end if end >= 0 else None].decode(errors="replace")
        sections.append(Section(name, sh_type, flags, addr, offset, size, link, info, entsize))
    return ElfFile(machine, e_type == ET_EXEC, tuple(loads), tuple(sections))


# A section-name table larger than this is not read (real ones are a few hundred bytes).
MAX_NAMES = 1 << 20


def read_symbol_table(f: BinaryIO) -> SymbolTable | None:
    """The file's .symtab where it keeps one, else its .dynsym (they agree on every symbol both
    hold). None where the file is not a 64-bit little-endian ELF; ValueError where its tables
    lie past its end."""
    elf = read_headers(f)
    if elf is None:
        return None
    tables = read_symbol_tables(f, elf, (SHT_SYMTAB, SHT_DYNSYM))
    if tables:
        return tables[0]
    empty = np.zeros(0, SYMBOL)
    return SymbolTable(elf.machine, elf.is_exec, elf.loads, empty, 0, 0)


def read_symbol_tables(
    f: BinaryIO, elf: ElfFile, kinds: tuple[int, ...] = (SHT_DYNSYM, SHT_SYMTAB)
) -> list[SymbolTable]:
    """Each symbol table of these kinds the file holds, in the order of `kinds`."""
    file_size = os.fstat(f.fileno()).st_size
    found = []
    for wanted in kinds:
        for section in elf.sections:
            if (
                section.type != wanted
                or section.entsize != SYMBOL.itemsize
                or section.link >= len(elf.sections)
            ):
                continue
            raw = _read(f, section.offset, section.size, file_size)
            symbols = np.frombuffer(raw, SYMBOL, len(raw) // SYMBOL.itemsize)
            symbols = symbols[(symbols["shndx"] != SHN_UNDEF) & (symbols["name"] != 0)]
            names = elf.sections[section.link]
            if names.offset + names.size > file_size:
                raise ValueError("a string table past the end of the file")
            found.append(
                SymbolTable(elf.machine, elf.is_exec, elf.loads, symbols, names.offset, names.size)
            )
            break
    return found


def _read(f: BinaryIO, offset: int, size: int, file_size: int) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ValueError("a table past the end of the file")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("the file ended inside a table")  # it shrank while being read
    return data
