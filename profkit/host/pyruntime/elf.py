"""Just enough ELF64 to find a symbol's address in a mapped file, plus /proc/PID/maps parsing."""

from __future__ import annotations

import os
import stat
import struct
from collections import OrderedDict
from dataclasses import dataclass

from .errors import PyRuntimeUnsupported

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")

_PT_LOAD = 1
_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_SHN_UNDEF = 0
EM_X86_64 = 62
EM_AARCH64 = 183


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str


def read_maps(pid: int) -> list[Mapping]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            text = f.read()
    except OSError as exc:
        raise PyRuntimeUnsupported(f"cannot read /proc/{pid}/maps: {exc.strerror}") from exc
    maps = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        path = parts[5] if len(parts) == 6 else ""
        maps.append(Mapping(start, end, parts[1], int(parts[2], 16), int(parts[4]), path))
    return maps


@dataclass(frozen=True)
class ElfSymbols:
    """The defined symbols of one ELF file (dynamic and, when not stripped, static)."""

    machine: int
    is_exec: bool  # ET_EXEC: addresses are absolute, no load bias
    first_load_vaddr: int  # page-aligned p_vaddr of the PT_LOAD that maps file offset 0
    symbols: dict[str, tuple[int, int]]  # name -> (st_value, st_size)

    def lookup(self, name: str) -> tuple[int, int] | None:
        return self.symbols.get(name)


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("ascii", "replace")


def parse_elf(data: bytes) -> ElfSymbols:
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("only 64-bit little-endian ELF is supported")
    header = _EHDR.unpack_from(data)
    e_type, machine, e_phoff, e_shoff = header[1], header[2], header[5], header[6]
    e_phentsize, e_phnum, e_shentsize, e_shnum = header[9], header[10], header[11], header[12]
    first_load = 0
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, _, _, p_align = _PHDR.unpack_from(
            data, e_phoff + i * e_phentsize
        )
        if p_type == _PT_LOAD and p_offset == 0:
            first_load = p_vaddr & ~(max(p_align, 1) - 1)
            break
    sections = [_SHDR.unpack_from(data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    symbols: dict[str, tuple[int, int]] = {}
    # .symtab first so that .dynsym (what the loader uses) wins on a clash.
    for wanted in (_SHT_SYMTAB, _SHT_DYNSYM):
        for _, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
            if sh_type != wanted or sh_entsize != _SYM.size or sh_link >= len(sections):
                continue
            str_off, str_size = sections[sh_link][4], sections[sh_link][5]
            strtab = data[str_off : str_off + str_size]
            for st_name, _, _, st_shndx, st_value, st_size in _SYM.iter_unpack(
                data[sh_offset : sh_offset + sh_size]
            ):
                if st_shndx == _SHN_UNDEF or st_name == 0:
                    continue
                symbols[_cstr(strtab, st_name)] = (st_value, st_size)
    return ElfSymbols(machine, e_type == 2, first_load, symbols)


_ELF_CACHE: OrderedDict[tuple[int, int, int, int], ElfSymbols] = OrderedDict()
_ELF_CACHE_SIZE = 16


# Larger than any interpreter or runtime build with its symbols; a file past it is not read.
MAX_ELF_BYTES = 512 * 1024 * 1024


def load_elf(path: str) -> ElfSymbols:
    # Keyed by the file, not the path: each process reaches the same interpreter through its
    # own /proc/PID/map_files path, and a long-running watcher sees many processes.
    # The target chose what it mapped: a device or FIFO under a runtime's name is refused
    # before it is read (O_NONBLOCK so that the open itself cannot block).
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ELF_BYTES:
            raise PyRuntimeUnsupported(f"{path}: not a regular file of at most {MAX_ELF_BYTES}")
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        elf = _ELF_CACHE.get(key)
        if elf is None:
            elf = parse_elf(f.read(MAX_ELF_BYTES))
    if key not in _ELF_CACHE:
        _ELF_CACHE[key] = elf
        while len(_ELF_CACHE) > _ELF_CACHE_SIZE:
            _ELF_CACHE.popitem(last=False)
    else:
        _ELF_CACHE.move_to_end(key)
    return elf


def target_file_path(pid: int, maps: list[Mapping], path: str) -> str:
    """A path from which to read a file the target has mapped.

    /proc/PID/map_files reaches the very file mapped even when it was replaced or deleted on
    disk since; /proc/PID/root resolves the name inside the target's mount namespace.
    """
    for m in maps:
        if m.path == path and m.offset == 0:
            mapped = f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"
            if os.path.exists(mapped):
                return mapped
            break
    rooted = f"/proc/{pid}/root{path}"
    return rooted if os.path.exists(rooted) else path


def load_bias(maps: list[Mapping], path: str, elf: ElfSymbols) -> int:
    """Address where the file's vaddr 0 lies in the target (0 for non-PIE executables)."""
    if elf.is_exec:
        return 0
    for m in maps:
        if m.path == path and m.offset == 0:
            return m.start - elf.first_load_vaddr
    raise PyRuntimeUnsupported(f"{path}: no mapping of file offset 0")
