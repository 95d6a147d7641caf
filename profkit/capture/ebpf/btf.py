"""BTF, the kernel's type format, read: the prebuilt object's own (its structs and maps, the
layouts user space reads its maps with) and the running kernel's (/sys/kernel/btf/vmlinux, which
the object's CO-RE reads are relocated against).

One pass over the type section records where each type lies and its name's offset; a type is
decoded when it is asked for. The kernel's BTF holds some hundred thousand types: its index
(where each type lies) is made once per boot and kept under the BTF's digest
(host/bootcache.py), and the BTF read once per process (kernel_btf()).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ...host import bootcache

MAGIC = 0xEB9F
VMLINUX = Path("/sys/kernel/btf/vmlinux")

INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
VOLATILE, CONST, RESTRICT, FUNC, FUNC_PROTO, VAR, DATASEC = 9, 10, 11, 12, 13, 14, 15
FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = 16, 17, 18, 19
# What follows a type's 12-byte header: a fixed size, or one record per vlen.
_FIXED = {INT: 4, ARRAY: 12, VAR: 4, DECL_TAG: 4}
_PER_ITEM = {STRUCT: 12, UNION: 12, ENUM: 8, FUNC_PROTO: 8, DATASEC: 12, ENUM64: 12}
_FIXED_BY_KIND = [_FIXED.get(kind, 0) for kind in range(32)]
_PER_ITEM_BY_KIND = [_PER_ITEM.get(kind, 0) for kind in range(32)]
# Kinds that only qualify another type: skipped to reach what they qualify.
QUALIFIERS = (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG)

_HEADER = struct.Struct("<HBBIIIII")
_TYPE = struct.Struct("<III")


class BtfError(ValueError):
    """Not BTF, or BTF that does not say what was asked of it."""


@dataclass(frozen=True)
class Type:
    kind: int
    name: str
    info: int  # the raw info word: vlen in the low 16 bits, kind_flag in bit 31
    size_or_type: int  # a struct's size, or the type a pointer, typedef... refers to
    at: int  # where its trailing records start, in the type section

    @property
    def vlen(self) -> int:
        return self.info & 0xFFFF

    @property
    def kind_flag(self) -> bool:
        return bool(self.info >> 31)


@dataclass(frozen=True)
class Member:
    name: str
    type_id: int
    bit_offset: int
    bit_size: int  # 0 unless a bitfield


@dataclass(frozen=True)
class Field:
    """A member of a struct as its user reads it: where it lies and how wide it is."""

    name: str
    offset: int
    size: int


class Btf:
    def __init__(self, data: bytes, index: bytes | None = None) -> None:
        """`index`: what index() gave for these same bytes, instead of a pass over them."""
        if len(data) < _HEADER.size:
            raise BtfError("shorter than a BTF header")
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = (
            _HEADER.unpack_from(data)
        )
        if magic != MAGIC:
            raise BtfError(f"not BTF (magic {magic:#x})")
        self.data = data
        types_at, strings_at = hdr_len + type_off, hdr_len + str_off
        if types_at + type_len > len(data) or strings_at + str_len > len(data):
            raise BtfError("sections past the end of the data")
        self._types_at = types_at
        self._types = data[types_at : types_at + type_len]
        self.strings = data[strings_at : strings_at + str_len]
        # Where each type's header lies and its name's offset, by id (id 0 is void); the rest
        # of a type is decoded when it is asked for.
        self._at: list[int] = [-1]
        self._name_at: list[int] = [0]
        if index is None or not self._take(index):
            self._parse()
        self._made: dict[int, Type] = {0: Type(0, "", 0, 0, 0)}
        self._names: np.ndarray | None = None

    def _parse(self) -> None:
        raw, at, end = self._types, 0, len(self._types)
        unpack, fixed, per_item = _TYPE.unpack_from, _FIXED_BY_KIND, _PER_ITEM_BY_KIND
        starts, names = self._at, self._name_at
        while at < end:
            if at + _TYPE.size > end:
                raise BtfError("a type cut short")
            name_off, info, _ = unpack(raw, at)
            kind = (info >> 24) & 0x1F
            if kind == 0 or kind > ENUM64:
                raise BtfError(f"unknown kind {kind} at type {len(starts)}")
            starts.append(at)
            names.append(name_off)
            at += _TYPE.size + fixed[kind] + per_item[kind] * (info & 0xFFFF)

    def index(self) -> bytes:
        """Where each type lies, for Btf(the same bytes, index)."""
        return np.asarray(self._at[1:], dtype="<u4").tobytes()

    def _take(self, index: bytes) -> bool:
        """The starts an earlier pass over these bytes found (kept under their digest, by
        root, in root's own directory: bootcache.py); False where they cannot be theirs."""
        starts = np.frombuffer(index, dtype="<u4") if len(index) % 4 == 0 else None
        end = len(self._types)
        if starts is None or not len(starts) or end % 4 or starts[0] != 0 or starts[-1] >= end:
            return False
        if (starts % 4).any() or (np.diff(starts.astype(np.int64)) <= 0).any():
            return False
        words = np.frombuffer(self._types, dtype="<u4")
        self._at += starts.tolist()
        self._name_at += words[starts // 4].tolist()
        return True

    def __len__(self) -> int:
        return len(self._at)

    def name(self, offset: int) -> str:
        if not 0 <= offset < len(self.strings):
            raise BtfError(f"a name at {offset}, past the strings")
        end = self.strings.find(b"\0", offset)
        return self.strings[offset : end if end >= 0 else None].decode(errors="replace")

    def __getitem__(self, type_id: int) -> Type:
        made = self._made.get(type_id)
        if made is not None:
            return made
        if not 0 <= type_id < len(self._at):
            raise BtfError(f"no type {type_id}")
        at = self._at[type_id]
        name_off, info, size_or_type = _TYPE.unpack_from(self._types, at)
        made = Type((info >> 24) & 0x1F, self.name(name_off), info, size_or_type, at + _TYPE.size)
        self._made[type_id] = made
        return made

    def named(self, name: str, kinds: tuple[int, ...] = ()) -> list[int]:
        """The ids of the types of this name (of these kinds)."""
        if not name:
            return []
        if self._names is None:
            self._names = np.asarray(self._name_at, dtype=np.int64)
        # The name's every whole occurrence in the strings (they are usually deduplicated, but
        # nothing requires it), each a 0-terminated string after another's 0.
        wanted, found, start = b"\0" + name.encode() + b"\0", [], 0
        while (at := self.strings.find(wanted, start)) >= 0:
            found += np.flatnonzero(self._names == at + 1).tolist()
            start = at + 1
        found.sort()
        return [i for i in found if not kinds or self[i].kind in kinds]

    def skip_qualifiers(self, type_id: int) -> int:
        for _ in range(64):  # a chain longer than any real one is a loop
            t = self[type_id]
            if t.kind not in QUALIFIERS:
                return type_id
            type_id = t.size_or_type
        raise BtfError("a loop of qualifiers")

    def members(self, type_id: int) -> list[Member]:
        t = self[type_id]
        if t.kind not in (STRUCT, UNION):
            raise BtfError(f"type {type_id} ({t.name}) is not a struct or union")
        found = []
        for i in range(t.vlen):
            name_off, member_type, offset = struct.unpack_from("<III", self._types, t.at + 12 * i)
            bits = offset >> 24 if t.kind_flag else 0
            found.append(
                Member(
                    self.name(name_off),
                    member_type,
                    offset & 0xFFFFFF if t.kind_flag else offset,
                    bits,
                )
            )
        return found

    def array(self, type_id: int) -> tuple[int, int, int]:
        """(element type, index type, elements) of an array."""
        t = self[type_id]
        if t.kind != ARRAY:
            raise BtfError(f"type {type_id} is not an array")
        return struct.unpack_from("<III", self._types, t.at)

    def datasec(self, type_id: int) -> list[tuple[int, int, int]]:
        """(variable type, offset, size) of each variable of a data section."""
        t = self[type_id]
        if t.kind != DATASEC:
            raise BtfError(f"type {type_id} is not a data section")
        return [struct.unpack_from("<III", self._types, t.at + 12 * i) for i in range(t.vlen)]

    def params(self, type_id: int) -> list[tuple[str, int]]:
        t = self[type_id]
        if t.kind != FUNC_PROTO:
            raise BtfError(f"type {type_id} is not a function prototype")
        return [
            (self.name(n), p)
            for n, p in (
                struct.unpack_from("<II", self._types, t.at + 8 * i) for i in range(t.vlen)
            )
        ]

    def enum_values(self, type_id: int) -> dict[str, int]:
        t = self[type_id]
        if t.kind != ENUM:
            raise BtfError(f"type {type_id} is not an enum")
        values = (struct.unpack_from("<Ii", self._types, t.at + 8 * i) for i in range(t.vlen))
        return {self.name(name): value for name, value in values}

    def int_encoding(self, type_id: int) -> tuple[bool, int]:
        """(signed, bits) of an integer type."""
        t = self[type_id]
        if t.kind != INT:
            raise BtfError(f"type {type_id} is not an integer")
        (word,) = struct.unpack_from("<I", self._types, t.at)
        return bool((word >> 24) & 1), word & 0xFF

    def size(self, type_id: int) -> int:
        """A type's size in bytes, through qualifiers and arrays."""
        for _ in range(64):
            type_id = self.skip_qualifiers(type_id)
            t = self[type_id]
            if t.kind in (INT, STRUCT, UNION, ENUM, ENUM64, FLOAT, DATASEC):
                return t.size_or_type
            if t.kind == PTR:
                return 8
            if t.kind == ARRAY:
                element, _, count = self.array(type_id)
                return self.size(element) * count
            raise BtfError(f"type {type_id} ({t.name}) has no size")
        raise BtfError("a loop of types")

    def layout(self, name: str) -> list[Field]:
        """The fields of the struct of this name, in order; each field's offset and size."""
        ids = self.named(name, (STRUCT,))
        if not ids:
            raise BtfError(f"no struct {name}")
        return [
            Field(m.name, m.bit_offset // 8, self.size(m.type_id)) for m in self.members(ids[0])
        ]


@lru_cache(maxsize=1)
def kernel_btf() -> Btf:
    """The running kernel's BTF; BtfError (an OSError's message) where it has none."""
    try:
        data = VMLINUX.read_bytes()
    except OSError as exc:
        raise BtfError(f"{VMLINUX}: {exc.strerror}") from exc
    cache = bootcache.shared()
    name = f"btf-index-{hashlib.blake2b(data, digest_size=16).hexdigest()}"
    kept = cache.get(name)
    btf = Btf(data, kept)
    index = btf.index()
    if index != kept:  # none kept, or one these bytes cannot have given
        cache.put(name, index)
    return btf
