"""A symbol's address in a file the target maps (host/elf.py reads the tables), and
/proc/PID/maps."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

from .. import mapped
from ..elf import MAX_ELF_BYTES, SymbolTable, open_elf, read_symbol_table
from ..mapped import Mapping
from .errors import PyRuntimeUnsupported

__all__ = ["ElfSymbols", "Mapping", "load_bias", "load_elf", "read_maps"]


def read_maps(pid: int) -> list[Mapping]:
    try:
        return mapped.read_maps(pid)
    except OSError as exc:
        raise PyRuntimeUnsupported(f"cannot read /proc/{pid}/maps: {exc.strerror}") from exc


@dataclass(frozen=True)
class ElfSymbols:
    """The defined symbols of one ELF file (host/elf.py's reader), looked up by name."""

    machine: int
    is_exec: bool  # ET_EXEC: addresses are absolute, no load bias
    first_load_vaddr: int  # page-aligned p_vaddr of the PT_LOAD that maps file offset 0
    table: SymbolTable
    strings: bytes

    def lookup(self, name: str) -> tuple[int, int] | None:
        return self.table.lookup(self.strings, name)


_ELF_CACHE: OrderedDict[tuple[int, int, int, int], ElfSymbols] = OrderedDict()
_ELF_CACHE_SIZE = 16


def load_elf(path: str) -> ElfSymbols:
    # Keyed by the file, not the path: each process reaches the same interpreter through its
    # own /proc/PID/map_files path, and a long-running watcher sees many processes.
    f = open_elf(path)
    if f is None:
        raise PyRuntimeUnsupported(
            f"{path}: not a regular file of at most {MAX_ELF_BYTES >> 20} MiB"
        )
    with f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        elf = _ELF_CACHE.get(key)
        if elf is None:
            table = read_symbol_table(f)
            if table is None:
                raise ValueError("not a 64-bit little-endian ELF file")
            elf = ElfSymbols(
                table.machine, table.is_exec, table.first_load_vaddr, table, table.strings(f)
            )
    if key not in _ELF_CACHE:
        _ELF_CACHE[key] = elf
        while len(_ELF_CACHE) > _ELF_CACHE_SIZE:
            _ELF_CACHE.popitem(last=False)
    else:
        _ELF_CACHE.move_to_end(key)
    return elf


def load_bias(maps: list[Mapping], file: mapped.MappedFile, elf: ElfSymbols) -> int:
    """Address where the file's vaddr 0 lies in the target (0 for non-PIE executables)."""
    if elf.is_exec:
        return 0
    own = (file.mapping.device, file.mapping.inode)
    for m in maps:
        if (m.device, m.inode) == own and m.offset == 0:
            return m.start - elf.first_load_vaddr
    raise PyRuntimeUnsupported(f"{file.path}: no mapping of file offset 0")
