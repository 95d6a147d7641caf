"""Address -> (function, file) for a process and the kernel, without bcc.

Where the eBPF programs were loaded through libbpf (no bcc on the node), the native stacks'
addresses are named here: the mapped file from /proc/PID/maps, the function from the file's
ELF symbol table (.symtab, else .dynsym), read with numpy in one pass per file (libtorch's
symbol table holds some hundred thousand functions), and the kernel's from /proc/kallsyms.
Files are read as the target maps them (/proc/PID/map_files), each at most once.
"""

from __future__ import annotations

import bisect
import os
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from .pyruntime.elf import MAX_ELF_BYTES, Mapping, read_maps, target_file_path

KERNEL_DSO = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"
_SYM = np.dtype(
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
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
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
    headers and the symbol and string tables are read, not the code."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    f = os.fdopen(fd, "rb")
    st = os.fstat(f.fileno())
    symbols = None
    if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_ELF_BYTES:
        try:
            symbols = _parse(f, st.st_size)
        except (OSError, struct.error, ValueError, IndexError):
            symbols = None
    if symbols is None or symbols.file is None:
        f.close()
    return symbols


def _read(f: BinaryIO, offset: int, size: int, file_size: int) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ValueError("a table past the end of the file")
    f.seek(offset)
    return f.read(size)


def _parse(f: BinaryIO, file_size: int) -> FileSymbols | None:
    head = _read(f, 0, _EHDR.size, file_size)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    header = _EHDR.unpack(head)
    e_phoff, e_shoff = header[5], header[6]
    e_phentsize, e_phnum, e_shentsize, e_shnum = header[9], header[10], header[11], header[12]
    program = _read(f, e_phoff, e_phentsize * e_phnum, file_size)
    loads = []
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = _PHDR.unpack_from(
            program, i * e_phentsize
        )
        if p_type == 1:
            loads.append((p_offset, p_filesz, p_vaddr))
    table = _read(f, e_shoff, e_shentsize * e_shnum, file_size)
    sections = [_SHDR.unpack_from(table, i * e_shentsize) for i in range(e_shnum)]
    for wanted in (2, 11):  # SHT_SYMTAB, else SHT_DYNSYM
        for _, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
            if sh_type != wanted or sh_entsize != _SYM.itemsize or sh_link >= len(sections):
                continue
            raw = _read(f, sh_offset, sh_size, file_size)
            symbols = np.frombuffer(raw, _SYM, len(raw) // _SYM.itemsize)
            kind = symbols["info"] & 0xF
            keep = ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC)) & (symbols["value"] != 0)
            symbols = symbols[keep]
            symbols = symbols[np.argsort(symbols["value"], kind="stable")]
            str_offset, str_size = sections[sh_link][4], sections[sh_link][5]
            if str_offset < 0 or str_size < 0 or str_offset + str_size > file_size:
                raise ValueError("a string table past the end of the file")
            return FileSymbols(
                symbols["value"].astype(np.uint64),
                (symbols["value"] + symbols["size"]).astype(np.uint64),
                symbols["name"].astype(np.int64),
                f,
                str_offset,
                str_size,
                tuple(loads),
            )
    empty = np.zeros(0, np.uint64)
    return FileSymbols(empty, empty, np.zeros(0, np.int64), None, 0, 0, tuple(loads))


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
        self._files: dict[str, FileSymbols | None] = {}
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
        if mapping.path not in self._files:
            self._files[mapping.path] = read_file_symbols(
                target_file_path(self._pid, self._all, mapping.path)
            )
        symbols = self._files[mapping.path]
        name = symbols.name_at(address - mapping.start + mapping.offset) if symbols else None
        return name or UNKNOWN, mapping.path
