"""Address -> (function, file) for a process and the kernel, without bcc.

Where the eBPF programs were loaded as the CO-RE object (no bcc on the node), the native stacks'
addresses are named here: the mapped file from /proc/PID/maps, the function from the file's
ELF symbol table (.symtab, else .dynsym), read with numpy in one pass per file (libtorch's
symbol table holds some hundred thousand functions), and the kernel's from /proc/kallsyms.
Files are read as the target maps them (host/mapped.py), each at most once.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from .elf import open_elf, read_symbol_table
from .mapped import Mapping, UnverifiedFile, checked_path, read_maps

KERNEL_DSO = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"
# A symbol name is read in chunks up to its NUL, and cut at this length (mangled C++ names run
# to a few KiB).
NAME_CHUNK_BYTES = 512
MAX_NAME_BYTES = 1 << 16


@dataclass(frozen=True)
class FileSymbols:
    """One ELF file's functions, sorted by address, and how file offsets map to addresses."""

    starts: np.ndarray
    ends: np.ndarray
    names: np.ndarray  # offsets into the string table
    # The string table is not read whole (a large library's runs to many megabytes,
    # docs/results/core-loader.md#command-to-prompt): a name is read from the open file when
    # asked for, never through a mapping of a file the target's user may truncate under it.
    file: BinaryIO | None
    strings_at: int
    strings_size: int
    loads: tuple[tuple[int, int, int], ...]  # (file offset, size, vaddr) per PT_LOAD

    def name_at(self, file_offset: int) -> str | None:
        vaddr = next(
            (v + file_offset - o for o, size, v in self.loads if o <= file_offset < o + size),
            None,
        )
        if vaddr is None or not len(self.starts):
            return None
        index = int(np.searchsorted(self.starts, vaddr, side="right")) - 1
        if index < 0 or vaddr >= max(int(self.ends[index]), int(self.starts[index]) + 1):
            return None
        return self._string(int(self.names[index]))

    def _string(self, offset: int) -> str | None:
        if self.file is None or not 0 <= offset < self.strings_size:
            return None
        name = b""
        while len(name) < MAX_NAME_BYTES and offset + len(name) < self.strings_size:
            at = self.strings_at + offset + len(name)
            try:
                chunk = os.pread(self.file.fileno(), NAME_CHUNK_BYTES, at)
            except (OSError, ValueError):
                return None
            if not chunk:
                break
            end = chunk.find(b"\0")
            if end >= 0:
                name += chunk[:end]
                break
            name += chunk
        return name[: self.strings_size - offset].decode(errors="replace")


def read_file_symbols(path: str) -> FileSymbols | None:
    """None for a file that is not a readable 64-bit little-endian ELF of bounded size. Only the
    headers and the symbol table are read, not the code; names are read as asked for."""
    try:
        f = open_elf(path)
    except OSError:
        return None
    if f is None:
        return None
    try:
        table = read_symbol_table(f)
    except (OSError, struct.error, ValueError, IndexError):
        table = None
    if table is None:
        f.close()
        return None
    loads = tuple((load.offset, load.file_size, load.vaddr) for load in table.loads)
    functions = table.functions()
    if not len(functions):
        f.close()
        empty = np.zeros(0, np.uint64)
        return FileSymbols(empty, empty, np.zeros(0, np.int64), None, 0, 0, loads)
    return FileSymbols(
        functions["value"].astype(np.uint64),
        (functions["value"] + functions["size"]).astype(np.uint64),
        functions["name"].astype(np.int64),
        f,
        table.strings_at,
        table.strings_size,
        loads,
    )


class KernelSymbols:
    """/proc/kallsyms's functions, sorted; empty where it shows no addresses (kptr_restrict).
    The file's hundred thousand lines are parsed as one array: every line of a 64-bit kernel
    starts with 16 hex digits, a space, the type letter and a space; a name is cut out only
    for an address that is asked for."""

    def __init__(self) -> None:
        try:
            with open("/proc/kallsyms", "rb") as f:
                text = f.read()
        except OSError:
            text = b""
        raw = np.frombuffer(text, np.uint8)
        begins = np.concatenate(([0], np.flatnonzero(raw == ord("\n")) + 1))
        begins = begins[begins + 19 <= len(raw)]
        kinds = raw[begins + 17]
        keep = (
            (raw[begins + 16] == ord(" "))
            & (raw[begins + 18] == ord(" "))
            & np.isin(kinds, np.frombuffer(b"tTwW", np.uint8))
        )
        begins = begins[keep]
        digits = raw[begins[:, None] + np.arange(16)]
        # '0'-'9' are 48-57, 'a'-'f' 97-102: the hex value of each digit.
        values = np.where(digits >= ord("a"), digits - (ord("a") - 10), digits - ord("0"))
        # Two hex digits a byte, eight bytes a big-endian address.
        pairs = (values[:, 0::2] << 4) | values[:, 1::2]
        addresses = np.ascontiguousarray(pairs, np.uint8).view(">u8").ravel().astype(np.uint64)
        valid = ((digits <= ord("9")) | ((digits >= ord("a")) & (digits <= ord("f")))).all(axis=1)
        keep = valid & (addresses != 0)
        order = np.argsort(addresses[keep], kind="stable")
        self._starts = addresses[keep][order]
        self._lines = begins[keep][order]
        self._text = text

    def name_at(self, address: int) -> str:
        index = int(np.searchsorted(self._starts, np.uint64(address), side="right")) - 1
        if index < 0:
            return UNKNOWN
        begin = int(self._lines[index]) + 19
        end = self._text.find(b"\n", begin)
        line = self._text[begin : end if end >= 0 else None]
        return line.split(b"\t", 1)[0].split(b" ", 1)[0].decode(errors="replace") or UNKNOWN


class ProcessSymbols:
    """Address -> (symbol, dso) for one process and the kernel, each address resolved once;
    the interface of capture.ebpf.native.Symbols."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        try:
            self._all: list[Mapping] = read_maps(pid)
        except Exception:
            self._all = []
        self._maps = sorted((m for m in self._all if "x" in m.perms), key=lambda m: m.start)
        self._starts = [m.start for m in self._maps]
        self._files: dict[tuple[int, int], FileSymbols | None] = {}
        self._kernel: KernelSymbols | None = None
        self._seen: dict[tuple[bool, int], tuple[str, str]] = {}

    def __enter__(self) -> ProcessSymbols:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the files whose names are read as asked for."""
        for symbols in self._files.values():
            if symbols is not None and symbols.file is not None:
                symbols.file.close()

    def frame(self, address: int, kernel: bool) -> tuple[str, str]:
        key = (kernel, address)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = self._kernel_frame(address) if kernel else self._user(address)
        return found

    def _kernel_frame(self, address: int) -> tuple[str, str]:
        if self._kernel is None:
            self._kernel = KernelSymbols()
        return self._kernel.name_at(address), KERNEL_DSO

    def _user(self, address: int) -> tuple[str, str]:
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0 or address >= self._maps[index].end:
            return UNKNOWN, UNKNOWN
        mapping = self._maps[index]
        if not mapping.path.startswith("/"):
            return UNKNOWN, mapping.path or UNKNOWN
        key = (mapping.device, mapping.inode)
        if key not in self._files:
            try:
                self._files[key] = read_file_symbols(checked_path(self._pid, mapping))
            except UnverifiedFile:
                self._files[key] = None
        symbols = self._files[key]
        name = symbols.name_at(address - mapping.start + mapping.offset) if symbols else None
        return name or UNKNOWN, mapping.path
