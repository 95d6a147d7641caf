"""Reading code objects, their strings and line tables out of a target process."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import MemoryReadError
from .layout import Layout
from .linetable import line_for
from .memory import ProcessMemory, i32_at, u32_at, u64_at

# Names and file names longer than this are cut: they only label samples.
MAX_STRING_CHARS = 4096
# Line tables are bounded by the code size; anything larger is not a real table.
MAX_LINETABLE_BYTES = 1 << 20


@dataclass(frozen=True)
class CodeInfo:
    filename: str
    name: str
    qualname: str
    firstlineno: int


def read_unicode(mem: ProcessMemory, layout: Layout, addr: int) -> str | None:
    """A compact str object's text, or None when ``addr`` does not hold one."""
    head = mem.read(addr, layout.unicode_compact_size)
    length = u64_at(head, 16)
    state = u32_at(head, layout.unicode_state)
    # The state bit-field is (interned:2, kind:3, compact:1, ascii:1, ...) in every
    # supported version.
    kind = (state >> 2) & 7
    compact = (state >> 5) & 1
    is_ascii = (state >> 6) & 1
    if not compact or kind not in (1, 2, 4) or length > 1 << 31:
        return None
    n = min(length, MAX_STRING_CHARS)
    start = layout.unicode_ascii_size if is_ascii else layout.unicode_compact_size
    raw = mem.read(addr + start, n * kind) if n else b""
    codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    return raw.decode(codec, "replace")


def read_bytes(mem: ProcessMemory, layout: Layout, addr: int, limit: int) -> bytes | None:
    size = mem.u64(addr + layout.bytes_size)
    if size > limit:
        return None
    return mem.read(addr + layout.bytes_sval, size) if size else b""


@dataclass(frozen=True)
class _Entry:
    # Fields that identify this incarnation of the code object at its address.
    fingerprint: tuple[int, ...]
    info: CodeInfo
    linetable: bytes
    lines: dict[int, int | None] = field(default_factory=dict, compare=False)


class CodeResolver:
    """Names and lines of code objects in one target, cached per address.

    A code object can be freed and its memory reused for another one; every ``resolve``
    re-reads the object's fixed header (one read) and drops the cached entry when its type,
    first line or string pointers changed.
    """

    def __init__(self, pid: int, layout: Layout, mem: ProcessMemory | None = None) -> None:
        self.pid = pid
        self.layout = layout
        self.mem = mem or ProcessMemory(pid)
        self._cache: dict[int, _Entry] = {}
        offsets = [
            layout.ob_type,
            layout.code_firstlineno,
            layout.code_filename,
            layout.code_name,
            layout.code_linetable,
        ]
        if layout.code_qualname >= 0:
            offsets.append(layout.code_qualname)
        self._header_size = max(offsets) + 8

    def close(self) -> None:
        self.mem.close()

    def _fingerprint(self, code_addr: int) -> tuple[int, ...] | None:
        lay = self.layout
        try:
            head = self.mem.read(code_addr, self._header_size)
        except MemoryReadError:
            return None
        if u64_at(head, lay.ob_type) != lay.code_type_addr:
            return None
        qual = u64_at(head, lay.code_qualname) if lay.code_qualname >= 0 else 0
        return (
            i32_at(head, lay.code_firstlineno),
            u64_at(head, lay.code_filename),
            u64_at(head, lay.code_name),
            qual,
            u64_at(head, lay.code_linetable),
        )

    def _entry(self, code_addr: int) -> _Entry | None:
        if code_addr == 0:
            return None
        fp = self._fingerprint(code_addr)
        cached = self._cache.get(code_addr)
        if fp is None:
            self._cache.pop(code_addr, None)
            return None
        if cached is not None:
            if cached.fingerprint == fp:
                return cached
            del self._cache[code_addr]
        firstlineno, filename_ptr, name_ptr, qual_ptr, table_ptr = fp
        try:
            filename = read_unicode(self.mem, self.layout, filename_ptr)
            name = read_unicode(self.mem, self.layout, name_ptr)
            qualname = read_unicode(self.mem, self.layout, qual_ptr) if qual_ptr else name
            table = read_bytes(self.mem, self.layout, table_ptr, MAX_LINETABLE_BYTES)
        except MemoryReadError:
            return None
        if filename is None or name is None or qualname is None or table is None:
            return None
        entry = _Entry(fp, CodeInfo(filename, name, qualname, firstlineno), table)
        self._cache[code_addr] = entry
        return entry

    def resolve(self, code_addr: int) -> CodeInfo | None:
        entry = self._entry(code_addr)
        return None if entry is None else entry.info

    def linetable(self, code_addr: int) -> bytes | None:
        entry = self._entry(code_addr)
        return None if entry is None else entry.linetable

    def line(self, code_addr: int, instr_index: int) -> int | None:
        entry = self._entry(code_addr)
        if entry is None:
            return None
        if instr_index not in entry.lines:
            try:
                entry.lines[instr_index] = line_for(
                    self.layout.version, entry.linetable, entry.info.firstlineno, instr_index
                )
            except (IndexError, ValueError):
                entry.lines[instr_index] = None
        return entry.lines[instr_index]
