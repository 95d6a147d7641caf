"""The prebuilt object read and made ready to load on this kernel, as libbpf would: its programs
cut from their sections, each instruction that names a map given the map's descriptor, and each
read of a kernel type's field (CO-RE) given the field's offset in the running kernel's BTF.

The object is profkit's own, built by `make probes`: this handles the forms that object has
(BTF-defined maps, the read-only .rodata, programs with no calls to one another, field-offset
and field-exists relocations), and refuses any other with an ObjectError rather than load
something it does not understand.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ....host.elf import Section, sections_of
from ..btf import ARRAY, STRUCT, UNION, Btf, BtfError, Member
from . import bpf

SHT_PROGBITS, SHT_SYMTAB, SHT_REL = 1, 2, 9
SHF_EXECINSTR = 0x4
STT_FUNC, STT_SECTION = 2, 3
_SYMBOL = struct.Struct("<IBBHQQ")  # name, info, other, shndx, value, size
_REL = struct.Struct("<QQ")
INSN = 8
LD_IMM64 = 0x18
PSEUDO_MAP_FD, PSEUDO_MAP_VALUE = 1, 2
# CO-RE relocation kinds (enum bpf_core_relo_kind).
FIELD_BYTE_OFFSET, FIELD_BYTE_SIZE, FIELD_EXISTS, FIELD_SIGNED = 0, 1, 2, 3
TYPE_EXISTS, TYPE_SIZE = 8, 9
# An instruction whose relocation found no field: a call of no helper, refused by the verifier
# only where it is reached (libbpf's poison; a branch the field's absence rules out never is).
POISON = struct.pack("<BBhi", 0x85, 0, 0, 0xBAD2310)
# Programs by section, as libbpf names them: type, expected attach type.
SECTIONS = {
    "uprobe": (bpf.PROG_KPROBE, 0),
    "perf_event": (bpf.PROG_PERF_EVENT, 0),
    "tp_btf": (bpf.PROG_TRACING, bpf.TRACE_RAW_TP),
}


class ObjectError(ValueError):
    """The object holds a form this loader does not handle, or does not fit this kernel."""


@dataclass
class ProgramCode:
    """One program: its instructions, relocated where load() says, and where it attaches."""

    name: str
    section: str
    offset: int  # in its section, in bytes
    insns: bytearray
    prog_type: int
    expected_attach_type: int
    attach_to: str = ""  # a BTF tracepoint's name (tp_btf/NAME)
    map_refs: list[tuple[int, str, int]] = field(default_factory=list)  # (insn, map, addend)


@dataclass
class ObjectFile:
    license: str
    programs: dict[str, ProgramCode]
    rodata: bytes
    btf: Btf
    core_relos: dict[str, list[tuple[int, int, str, int]]]  # section -> (off, type, access, kind)


def read_object(data: bytes, btf: Btf) -> ObjectFile:
    """The object's programs, their map references and CO-RE relocations, its .rodata."""
    try:
        sections = sections_of(data)
    except ValueError as exc:
        raise ObjectError(f"not an ELF object: {exc}") from exc
    by_name = {s.name: (i, s) for i, s in enumerate(sections)}

    def body(section: Section) -> bytes:
        return data[section.offset : section.offset + section.size]

    symtab = next((s for s in sections if s.type == SHT_SYMTAB), None)
    if symtab is None:
        raise ObjectError("no symbol table")
    strings = body(sections[symtab.link])
    symbols = []
    raw = body(symtab)
    for at in range(0, len(raw) - _SYMBOL.size + 1, _SYMBOL.size):
        name_at, info, _, shndx, value, size = _SYMBOL.unpack_from(raw, at)
        end = strings.find(b"\0", name_at)
        name = strings[name_at:end].decode()
        symbols.append((name, info & 0xF, shndx, value, size))
    programs: dict[str, ProgramCode] = {}
    for name, kind, shndx, value, size in symbols:
        if kind != STT_FUNC or not 0 < shndx < len(sections):
            continue
        section = sections[shndx]
        if not section.flags & SHF_EXECINSTR:
            continue
        if section.name == ".text":
            raise ObjectError(f"{name}: a function called from the programs (not handled)")
        family, _, attach_to = section.name.partition("/")
        if family not in SECTIONS:
            raise ObjectError(f"{name}: a program of section {section.name} (not handled)")
        prog_type, attach_type = SECTIONS[family]
        code = bytearray(body(section)[value : value + size])
        programs[name] = ProgramCode(
            name, section.name, value, code, prog_type, attach_type, attach_to
        )
    _map_references(data, sections, symbols, programs)
    rodata = body(by_name[".rodata"][1]) if ".rodata" in by_name else b""
    license_section = by_name.get("license")
    license = body(license_section[1]).rstrip(b"\0").decode() if license_section else ""
    ext = by_name.get(".BTF.ext")
    core_relos = _core_relocations(body(ext[1]), btf) if ext else {}
    return ObjectFile(license, programs, rodata, btf, core_relos)


def _map_references(
    data: bytes,
    sections: list[Section],
    symbols: list[tuple[str, int, int, int, int]],
    programs: dict[str, ProgramCode],
) -> None:
    """Each instruction that loads a map's address, by the program's relocation section."""
    for rel in sections:
        if rel.type != SHT_REL:
            continue
        target = sections[rel.info]
        raw = data[rel.offset : rel.offset + rel.size]
        for at in range(0, len(raw), _REL.size):
            offset, info = _REL.unpack_from(raw, at)
            name, kind, shndx, value, _ = symbols[info >> 32]
            holder = sections[shndx].name if 0 < shndx < len(sections) else ""
            program = next(
                (
                    p
                    for p in programs.values()
                    if p.section == target.name and p.offset <= offset < p.offset + len(p.insns)
                ),
                None,
            )
            if program is None:
                continue
            index = (offset - program.offset) // INSN
            if program.insns[index * INSN] != LD_IMM64:
                raise ObjectError(f"{program.name}: a relocation on a non-map instruction")
            if holder == ".maps":
                program.map_refs.append((index, name, 0))
            elif holder == ".rodata":
                addend = 0 if kind == STT_SECTION else value
                program.map_refs.append((index, ".rodata", addend))
            else:
                raise ObjectError(f"{program.name}: a reference into {holder or '?'}")


def _core_relocations(ext: bytes, btf: Btf) -> dict[str, list[tuple[int, int, str, int]]]:
    """.BTF.ext's CO-RE relocations by program section: (byte offset, local type, access
    string, kind)."""
    magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", ext)
    if magic != 0xEB9F:
        raise ObjectError(".BTF.ext: not BTF")
    if hdr_len < 32:
        return {}
    core_off, core_len = struct.unpack_from("<II", ext, 24)
    start = hdr_len + core_off
    found: dict[str, list[tuple[int, int, str, int]]] = {}
    if not core_len:
        return found
    (record,) = struct.unpack_from("<I", ext, start)
    at, end = start + 4, start + core_len
    while at < end:
        section_at, count = struct.unpack_from("<II", ext, at)
        at += 8
        relos = found.setdefault(btf.name(section_at), [])
        for _ in range(count):
            insn_off, type_id, access_at, kind = struct.unpack_from("<IIII", ext, at)
            relos.append((insn_off, type_id, btf.name(access_at), kind))
            at += record
    return found


def relocate_core(code: ProgramCode, objfile: ObjectFile, kernel: Btf) -> None:
    """Each CO-RE read of a kernel field given the running kernel's offset (or 0/1 for
    exists), the instruction patched where it lies; a field the kernel lacks poisons it."""
    for insn_off, type_id, access, kind in objfile.core_relos.get(code.section, []):
        if not code.offset <= insn_off < code.offset + len(code.insns):
            continue
        at = insn_off - code.offset
        found = _resolve(objfile.btf, type_id, access, kernel)
        if kind == FIELD_EXISTS:
            _patch(code.insns, at, 1 if found is not None else 0)
        elif kind in (FIELD_BYTE_OFFSET, FIELD_BYTE_SIZE):
            if found is None:
                code.insns[at : at + INSN] = POISON
            else:
                _patch(code.insns, at, found[0] if kind == FIELD_BYTE_OFFSET else found[1])
        elif kind in (TYPE_EXISTS, TYPE_SIZE):
            target = _candidates(objfile.btf, type_id, kernel)
            value = (
                (1 if target else 0)
                if kind == TYPE_EXISTS
                else (kernel.size(target[0]) if target else 0)
            )
            _patch(code.insns, at, value)
        else:
            raise ObjectError(f"{code.name}: CO-RE relocation kind {kind} (not handled)")


def _patch(insns: bytearray, at: int, value: int) -> None:
    opcode = insns[at]
    cls = opcode & 0x07
    if opcode == LD_IMM64:
        struct.pack_into("<I", insns, at + 4, value & 0xFFFFFFFF)
        struct.pack_into("<I", insns, at + 12, (value >> 32) & 0xFFFFFFFF)
    elif cls in (0x04, 0x07) and not opcode & 0x08:  # ALU/ALU64 with an immediate
        struct.pack_into("<i", insns, at + 4, value)
    elif cls in (0x01, 0x02, 0x03):  # LDX, ST, STX: the offset field
        if not -(1 << 15) <= value < 1 << 15:
            raise ObjectError(f"a field offset {value} past an instruction's reach")
        struct.pack_into("<h", insns, at + 2, value)
    else:
        raise ObjectError(f"a CO-RE relocation on instruction {opcode:#x} (not handled)")


def essential(name: str) -> str:
    """A type's name without its CO-RE flavour (task_struct___old is task_struct)."""
    return name.split("___", 1)[0]


def _candidates(local: Btf, type_id: int, kernel: Btf) -> list[int]:
    t = local[local.skip_qualifiers(type_id)]
    kinds = (STRUCT, UNION) if t.kind in (STRUCT, UNION) else (t.kind,)
    return kernel.named(essential(t.name), kinds)


def _resolve(local: Btf, type_id: int, access: str, kernel: Btf) -> tuple[int, int] | None:
    """(byte offset, byte size) in the kernel of the field the access string reaches from the
    local type; None where no kernel type of that name has it."""
    try:
        path = [int(part) for part in access.split(":")]
    except ValueError as exc:
        raise ObjectError(f"a CO-RE access string {access!r}") from exc
    for candidate in _candidates(local, type_id, kernel):
        found = _walk(local, local.skip_qualifiers(type_id), kernel, candidate, path)
        if found is not None:
            return found
    return None


def _walk(
    local: Btf, local_id: int, kernel: Btf, kernel_id: int, path: list[int]
) -> tuple[int, int] | None:
    offset_bits = path[0] * 8 * kernel.size(kernel_id)  # the root's array index
    size = kernel.size(kernel_id)
    for index in path[1:]:
        local_t = local[local.skip_qualifiers(local_id)]
        kernel_id = kernel.skip_qualifiers(kernel_id)
        if local_t.kind == ARRAY:
            local_element, _, _ = local.array(local.skip_qualifiers(local_id))
            kernel_element, _, _ = kernel.array(kernel_id)
            size = kernel.size(kernel_element)
            offset_bits += index * 8 * size
            local_id, kernel_id = local_element, kernel_element
            continue
        member = local.members(local.skip_qualifiers(local_id))[index]
        match = _member(kernel, kernel_id, member.name)
        if match is None:
            return None
        bits, kernel_member = match
        offset_bits += bits
        local_id, kernel_id = member.type_id, kernel_member.type_id
        size = kernel.size(kernel_id)
    if offset_bits % 8:
        return None  # a bitfield: not read this way
    return offset_bits // 8, size


def _member(kernel: Btf, type_id: int, name: str) -> tuple[int, Member] | None:
    """The named member of a kernel struct, looked for through its anonymous members too: its
    bit offset from the struct's start, and the member."""
    type_id = kernel.skip_qualifiers(type_id)
    if kernel[type_id].kind not in (STRUCT, UNION):
        return None
    try:
        members = kernel.members(type_id)
    except BtfError:
        return None
    for m in members:
        if m.name == name:
            return m.bit_offset, m
    for m in members:
        if not m.name:
            inner = _member(kernel, m.type_id, name)
            if inner is not None:
                return m.bit_offset + inner[0], inner[1]
    return None
