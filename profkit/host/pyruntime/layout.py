"""Where the interpreter's structures live in a target process, and the offsets to walk them.

Layouts of the thread state and interpreter frame are private to each CPython minor version.
Before 3.13 nothing in the process describes them, so they come from a per-version table
(x86-64 release builds).  Code-object offsets are described by the interpreter itself through
``PyCode_Type.tp_members``; 3.13 publishes everything in ``_Py_DebugOffsets`` at the start of
``_PyRuntime``.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Literal, TypedDict

from .. import mapped
from ..elf import EM_X86_64
from .elf import ElfSymbols, Mapping, load_bias, load_elf, read_maps
from .errors import MemoryReadError, PyRuntimeUnsupported
from .memory import ProcessMemory, u64_at

SUPPORTED = ((3, 10), (3, 11), (3, 12), (3, 13), (3, 14), (3, 15))
_RELEASE_CANDIDATE = 0xC  # PY_RELEASE_LEVEL_GAMMA

# PyTypeObject fields used here; stable across the supported versions on 64-bit builds.
TYPE_BASICSIZE = 32
TYPE_MEMBERS = 240
_MEMBERDEF = struct.Struct("<QiiqiiQ")  # name, type, (pad), offset, flags, (pad), doc


@dataclass(frozen=True)
class Layout:
    version: tuple[int, int]
    source: str
    runtime_addr: int
    interpreters_head: int
    interp_threads_head: int
    tstate_next: int
    tstate_native_thread_id: int  # -1 in 3.10, which has only the pthread_t (tstate_thread_id)
    frame_kind: str  # "frameobject" (3.10) | "cframe" (3.11, 3.12) | "direct" (3.13)
    tstate_frame: int
    cframe_current_frame: int
    frame_code: int
    frame_previous: int
    frame_instr: int
    frame_owner: int
    owner_cstack: int
    code_firstlineno: int
    code_filename: int
    code_name: int
    code_qualname: int  # -1 in 3.10 (no co_qualname): the name stands in
    code_linetable: int
    code_adaptive: int
    # Beyond what the stack walk needs: identifying code objects, decoding strings and bytes.
    tstate_thread_id: int = -1  # pthread_t of the thread
    code_type_addr: int = 0  # address of PyCode_Type in the target
    ob_type: int = 8
    unicode_state: int = 32
    unicode_ascii_size: int = 40  # sizeof(PyASCIIObject): where compact ASCII data starts
    unicode_compact_size: int = 56  # sizeof(PyCompactUnicodeObject): other compact strings
    bytes_size: int = 16
    bytes_sval: int = 32
    full_version: int = 0  # PY_VERSION_HEX when the target says it (3.11+), else 0
    # Low bits of a frame's code reference that tag it rather than address it: 3.14's frames
    # hold a _PyStackRef there; 0 before.
    code_tag: int = 0
    # Where the interpreter is: "shared (libpython3.13.so.1.0)" or "static (in python3.14)";
    # default (GIL) builds only (free-threaded ones are refused).
    build: str = ""

    @property
    def version_text(self) -> str:
        """3.14.10, or 3.10 where the target does not say its micro version."""
        if not self.full_version:
            return ".".join(map(str, self.version))
        micro, level, serial = (
            (self.full_version >> 8) & 0xFF,
            (self.full_version >> 4) & 0xF,
            self.full_version & 0xF,
        )
        tag = {0xA: f"a{serial}", 0xB: f"b{serial}", 0xC: f"rc{serial}"}.get(level, "")
        return f"{self.version[0]}.{self.version[1]}.{micro}{tag}"

    def frame_span(self) -> int:
        """Bytes from the frame start that cover every field the walk reads."""
        ends = [self.frame_code + 8, self.frame_previous + 8]
        ends.append(self.frame_instr + (4 if self.frame_kind == "frameobject" else 8))
        if self.frame_owner >= 0:
            ends.append(self.frame_owner + 1)
        return max(ends)


class _Offsets(TypedDict):
    """Layout's fields that a version's table or _Py_DebugOffsets supply."""

    interpreters_head: int
    interp_threads_head: int
    tstate_next: int
    tstate_native_thread_id: int
    frame_kind: str
    tstate_frame: int
    cframe_current_frame: int
    frame_code: int
    frame_previous: int
    frame_instr: int
    frame_owner: int
    owner_cstack: int
    code_firstlineno: int
    code_filename: int
    code_name: int
    code_qualname: int
    code_linetable: int
    code_adaptive: int
    tstate_thread_id: int
    unicode_ascii_size: int
    unicode_compact_size: int


class _DebugOffsets(_Offsets):
    """_Py_DebugOffsets also gives the object, bytes and string headers."""

    ob_type: int
    unicode_state: int
    bytes_size: int
    bytes_sval: int
    code_tag: int


def _table(version: tuple[int, int]) -> _Offsets:
    if version == (3, 10):
        return _Offsets(
            interpreters_head=32, interp_threads_head=8, tstate_next=8,
            tstate_native_thread_id=-1, tstate_thread_id=176, frame_kind="frameobject",
            tstate_frame=24, cframe_current_frame=-1, frame_code=32, frame_previous=24,
            frame_instr=96, frame_owner=-1, owner_cstack=-1, code_firstlineno=40,
            code_filename=104, code_name=112, code_qualname=-1, code_linetable=120,
            code_adaptive=-1, unicode_ascii_size=48, unicode_compact_size=72,
        )  # fmt: skip
    if version == (3, 11):
        # 3.11 has no shim frames: entry frames are ordinary frames flagged is_entry.
        return _Offsets(
            interpreters_head=40, interp_threads_head=16, tstate_next=8,
            tstate_native_thread_id=160, tstate_thread_id=152, frame_kind="cframe",
            tstate_frame=56, cframe_current_frame=8, frame_code=32, frame_previous=48,
            frame_instr=56, frame_owner=69, owner_cstack=-1, code_firstlineno=72,
            code_filename=112, code_name=120, code_qualname=128, code_linetable=136,
            code_adaptive=184, unicode_ascii_size=48, unicode_compact_size=72,
        )  # fmt: skip
    if version == (3, 12):
        return _Offsets(
            interpreters_head=40, interp_threads_head=72, tstate_next=8,
            tstate_native_thread_id=144, tstate_thread_id=136, frame_kind="cframe",
            tstate_frame=56, cframe_current_frame=0, frame_code=0, frame_previous=8,
            frame_instr=56, frame_owner=70, owner_cstack=3, code_firstlineno=68,
            code_filename=112, code_name=120, code_qualname=128, code_linetable=136,
            code_adaptive=192, unicode_ascii_size=40, unicode_compact_size=56,
        )  # fmt: skip
    raise PyRuntimeUnsupported(f"no offset table for Python {version[0]}.{version[1]}")


@dataclass(frozen=True)
class _Found:
    path: str  # as named in the target's maps
    elf: ElfSymbols
    bias: int


def _find_runtime(pid: int, maps: list[Mapping]) -> _Found:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as exc:
        raise PyRuntimeUnsupported(f"pid {pid}: cannot read /proc/{pid}/exe: {exc}") from exc
    exe = exe.removesuffix(" (deleted)")
    files = mapped.mapped_files(pid, maps)
    candidates = [
        f for f in files if re.match(r"libpython3\.\d+[a-z]*\.so", os.path.basename(f.path))
    ]
    # A statically linked interpreter carries the runtime in the executable itself.
    candidates += [f for f in files if f.path == exe]
    for file in candidates:
        try:
            elf = load_elf(file.checked())
        except (OSError, ValueError):
            continue
        if elf.lookup("_PyRuntime") is not None:
            return _Found(file.path, elf, load_bias(maps, file, elf))
    raise PyRuntimeUnsupported(
        f"pid {pid}: no _PyRuntime symbol in {exe} or a libpython (not CPython 3, or stripped)"
    )


def _name_version(path: str) -> tuple[int, int] | None:
    match = re.search(r"python(3)\.(\d+)", os.path.basename(path))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _symbol(found: _Found, name: str) -> int | None:
    sym = found.elf.lookup(name)
    return None if sym is None else found.bias + sym[0]


def _code_members(mem: ProcessMemory, code_type: int) -> tuple[dict[str, int], int]:
    """(member name -> offset, tp_basicsize) of the target's PyCode_Type."""
    basicsize = mem.u64(code_type + TYPE_BASICSIZE)
    members_addr = mem.u64(code_type + TYPE_MEMBERS)
    members: dict[str, int] = {}
    for i in range(64):
        name_ptr, _, _, offset, _, _, _ = _MEMBERDEF.unpack(
            mem.read(members_addr + i * _MEMBERDEF.size, _MEMBERDEF.size)
        )
        if name_ptr == 0:
            break
        raw = mem.read(name_ptr, 32)
        members[raw.split(b"\0", 1)[0].decode("ascii", "replace")] = offset
    return members, basicsize


_CodeField = Literal[
    "code_firstlineno", "code_filename", "code_name", "code_qualname", "code_linetable"
]
_CODE_MEMBER_FIELDS: dict[str, _CodeField] = {
    "co_firstlineno": "code_firstlineno",
    "co_filename": "code_filename",
    "co_name": "code_name",
    "co_qualname": "code_qualname",
    "co_linetable": "code_linetable",
}


@dataclass(frozen=True)
class DebugSections:
    """Where _Py_DebugOffsets' sections start in it (bytes) and where in each the fields the
    walker reads lie (indexes of uint64 fields; each section's field 0 is its struct's size).
    The structure describes the interpreter's layout but not its own, so this is the one
    per-minor-version table left: 3.14 adds interpreter and frame fields, 3.15 thread-state
    fields in front of thread_id. Every value read is checked against its section's size, and
    the walker's self-check walks every thread before use, so a patch release or a pre-release
    whose table moved is refused, never misread."""

    read: int  # bytes of _Py_DebugOffsets to read
    runtime: int
    interp: int
    tstate: int
    frame: int
    code: int
    pyobject: int
    bytes: int
    unicode: int
    tstate_thread_id: int  # the field indexes that move between versions
    tstate_native_thread_id: int
    tstate_fields: int  # fields of the thread_state section, its size included
    frame_fields: int
    code_fields: int
    interp_fields: int
    code_tag: int  # low bits of a frame's f_executable that tag it (a _PyStackRef from 3.14)


DEBUG_SECTIONS = {
    (3, 13): DebugSections(
        584, 24, 48, 152, 224, 272, 352, 512, 536, 5, 6, 9, 6, 10, 13, code_tag=0
    ),
    (3, 14): DebugSections(
        760, 24, 48, 176, 248, 312, 400, 592, 616, 5, 6, 9, 8, 11, 16, code_tag=3
    ),
    (3, 15): DebugSections(
        888, 24, 48, 176, 312, 376, 464, 688, 712, 8, 9, 16, 8, 11, 16, code_tag=3
    ),
}


def _debug_offsets_layout(
    mem: ProcessMemory, runtime: int, version_hex: int, version: tuple[int, int]
) -> _DebugOffsets:
    s = DEBUG_SECTIONS[version]
    raw = mem.read(runtime, s.read)
    if raw[:8] != b"xdebugpy":
        raise PyRuntimeUnsupported("_PyRuntime does not start with the _Py_DebugOffsets cookie")
    if u64_at(raw, 8) >> 16 != version_hex >> 16:
        raise PyRuntimeUnsupported(
            f"_Py_DebugOffsets version {u64_at(raw, 8):#x} differs from Py_Version {version_hex:#x}"
        )
    if u64_at(raw, 16):
        # The object header is 32 bytes there and frames carry thread-local bytecode: the
        # walker would need another program; refused rather than misread.
        raise PyRuntimeUnsupported(
            "free-threaded CPython builds are not supported (py-spy samples them instead)"
        )

    def q(section: int, index: int) -> int:
        return u64_at(raw, section + 8 * index)

    # Each section starts with the size of its structure: every offset must fall inside it.
    sections = {
        s.runtime: 3,
        s.interp: 4,
        s.tstate: s.tstate_native_thread_id + 1,
        s.frame: 6,
        s.code: 10,
        s.pyobject: 2,
        s.bytes: 3,
        s.unicode: 4,
    }
    for section, count in sections.items():
        size = q(section, 0)
        if not 0 < size < 1 << 20 or any(q(section, i) >= size for i in range(1, count)):
            raise PyRuntimeUnsupported(
                f"_Py_DebugOffsets section at +{section} is inconsistent (Python "
                f"{version_hex:#x}: a table that moved within {version[0]}.{version[1]})"
            )
    ascii_size = q(s.unicode, 3)
    return _DebugOffsets(
        interpreters_head=q(s.runtime, 2), interp_threads_head=q(s.interp, 3),
        tstate_next=q(s.tstate, 2), tstate_frame=q(s.tstate, 4),
        tstate_thread_id=q(s.tstate, s.tstate_thread_id),
        tstate_native_thread_id=q(s.tstate, s.tstate_native_thread_id),
        frame_kind="direct", cframe_current_frame=-1, frame_previous=q(s.frame, 1),
        frame_code=q(s.frame, 2), frame_instr=q(s.frame, 3), frame_owner=q(s.frame, 5),
        # The lowest owner of a frame with no code of the program's (3.12-3.13: CSTACK; 3.14
        # and 3.15: INTERPRETER, CSTACK above it): an enum value, not published.
        owner_cstack=3, code_filename=q(s.code, 1), code_name=q(s.code, 2),
        code_qualname=q(s.code, 3), code_linetable=q(s.code, 4),
        code_firstlineno=q(s.code, 5), code_adaptive=q(s.code, 9),
        ob_type=q(s.pyobject, 1), bytes_size=q(s.bytes, 1), bytes_sval=q(s.bytes, 2),
        unicode_state=q(s.unicode, 1), unicode_ascii_size=ascii_size,
        # PyCompactUnicodeObject adds utf8_length and utf8 to the ASCII header.
        unicode_compact_size=ascii_size + 16, code_tag=s.code_tag,
    )  # fmt: skip


def detect(pid: int) -> Layout:
    """Find the target's CPython runtime and the offsets needed to walk its stacks."""
    if not os.path.exists(f"/proc/{pid}"):
        raise PyRuntimeUnsupported(f"pid {pid}: no such process")
    maps = read_maps(pid)
    found = _find_runtime(pid, maps)
    if found.elf.machine != EM_X86_64:
        raise PyRuntimeUnsupported(
            f"{found.path}: only x86-64 CPython is supported (ELF machine {found.elf.machine})"
        )
    if found.elf.lookup("_Py_NegativeRefcount") is not None:
        raise PyRuntimeUnsupported(f"{found.path}: debug builds of CPython are not supported")
    runtime = _symbol(found, "_PyRuntime")
    code_type = _symbol(found, "PyCode_Type")
    assert runtime is not None
    if code_type is None:
        raise PyRuntimeUnsupported(f"{found.path}: no PyCode_Type symbol")
    with ProcessMemory(pid) as mem:
        try:
            return _detect(mem, found, runtime, code_type)
        except MemoryReadError as exc:
            raise PyRuntimeUnsupported(f"reading interpreter state failed: {exc}") from exc


def _detect(mem: ProcessMemory, found: _Found, runtime: int, code_type: int) -> Layout:
    version_addr = _symbol(found, "Py_Version")
    version_hex = 0
    if version_addr is not None:
        version_hex = mem.u64(version_addr) & 0xFFFFFFFF
        version = (version_hex >> 24, (version_hex >> 16) & 0xFF)
    else:
        # Py_Version appeared in 3.11: without it only an older interpreter is possible.
        named = _name_version(found.path)
        if named is None or named >= (3, 11):
            raise PyRuntimeUnsupported(f"{found.path}: cannot tell the Python version")
        version = named
    if version not in SUPPORTED:
        raise PyRuntimeUnsupported(
            f"Python {version[0]}.{version[1]} is not supported "
            f"(supported: {', '.join(f'{a}.{b}' for a, b in SUPPORTED)})"
        )
    if version < (3, 13) and version_hex and (version_hex >> 4) & 0xF < _RELEASE_CANDIDATE:
        # Private layouts still move during a minor version's alphas and betas, and before
        # 3.13 nothing in the process says how.
        raise PyRuntimeUnsupported(
            f"Python pre-release {version_hex:#x} is not supported (only rc and final)"
        )
    fields: _Offsets
    if version >= (3, 13):
        fields = _debug_offsets_layout(mem, runtime, version_hex, version)
        source = "_Py_DebugOffsets"
    else:
        fields = _table(version)
        source = f"table {version[0]}.{version[1]}"
        members, basicsize = _code_members(mem, code_type)
        used = [(m, f) for m, f in _CODE_MEMBER_FIELDS.items() if m in members]
        for m, f in used:
            fields[f] = members[m]
        if used:
            source += " + PyCode_Type members"
        if version >= (3, 11):
            # co_code_adaptive is the variable-size tail right after the fixed part.
            fields["code_adaptive"] = basicsize
    name = os.path.basename(found.path)
    build = f"shared ({name})" if name.startswith("libpython") else f"static (in {name})"
    return Layout(
        version=version,
        source=source,
        runtime_addr=runtime,
        code_type_addr=code_type,
        full_version=version_hex,
        build=build,
        **fields,
    )
