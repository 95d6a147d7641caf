"""The target's process program, as both loaders see it: its one source (probes/process.bpf.c),
the object built from it (probes/process.bpf.o), its programs' names, its read-only config and
capacities, and the types its maps are read with.

The maps' key and value types, and the config, come from the object's BTF: each struct is
written once, in the C source, and user space takes its layout from what the compiler emitted
(a ctypes type built per struct, checked field by field against the BTF's offsets). bcc builds
the same types from what it compiles.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from ...host.elf import section_data
from ...host.pyruntime import Layout
from .btf import ARRAY, DATASEC, ENUM, INT, PTR, STRUCT, UNION, Btf, BtfError

SOURCE = "process.bpf.c"
WALK_HEADER = "pywalk.h"
OBJECT = "process.bpf.o"

SAMPLER = "on_cpu_sample"
REGION_ENTRY = "on_region_entry"  # CO-RE: one program, told its copy by the attach cookie
REGION_END = "on_region_return"
CALIBRATE = "on_calibrate"
# The scheduler's programs and the tracepoint each is on; the last is the dispatchers' (who
# wakes the pool's workers), attached only where the sampler runs.
SCHED_PROGRAMS = {
    "on_switch": "sched_switch",
    "on_wakeup": "sched_wakeup",
    "on_wakeup_new": "sched_wakeup_new",
}
WAKING_PROGRAM = ("on_waking", "sched_waking")

# The walker's frame buffer (pywalk.h): a layout whose fields span more cannot be walked.
PY_FRAME_SPAN_MAX = 128
FRAME_KINDS = {"frameobject": 1, "cframe": 2, "direct": 3}
# An entry attachment's cookie: the copy's index below, where the team size is above.
COOKIE_COPY_BITS = 16


def entry_cookie(runtime: int, requested_arg: int) -> int:
    return runtime | (requested_arg << COOKIE_COPY_BITS)


def probe_file(name: str) -> bytes:
    return resources.files(__package__ + ".probes").joinpath(name).read_bytes()


@lru_cache(maxsize=1)
def object_btf() -> Btf:
    """The object's own BTF: its structs and maps."""
    data = section_data(probe_file(OBJECT), ".BTF")
    if data is None:
        raise BtfError(f"{OBJECT} has no .BTF section")
    return Btf(data)


_INTS = {
    (False, 8): ctypes.c_uint8,
    (False, 16): ctypes.c_uint16,
    (False, 32): ctypes.c_uint32,
    (False, 64): ctypes.c_uint64,
    (True, 8): ctypes.c_int8,
    (True, 16): ctypes.c_int16,
    (True, 32): ctypes.c_int32,
    (True, 64): ctypes.c_int64,
}


def ctype(btf: Btf, type_id: int) -> Any:
    """The ctypes type of a BTF type: integers, pointers (as addresses), arrays and structs.
    A struct's ctypes layout is checked against the BTF's member offsets: ValueError where they
    disagree (padding ctypes would place otherwise)."""
    type_id = btf.skip_qualifiers(type_id)
    t = btf[type_id]
    if t.kind == INT:
        return _INTS[btf.int_encoding(type_id)]
    if t.kind == ENUM:
        return ctypes.c_uint32
    if t.kind == PTR:
        return ctypes.c_uint64
    if t.kind == ARRAY:
        element, _, count = btf.array(type_id)
        return ctype(btf, element) * count
    if t.kind in (STRUCT, UNION):
        members = btf.members(type_id)
        if any(m.bit_size or m.bit_offset % 8 for m in members):
            raise BtfError(f"struct {t.name} has bitfields")
        fields = [(m.name, ctype(btf, m.type_id)) for m in members]
        base = ctypes.Structure if t.kind == STRUCT else ctypes.Union
        made = type(t.name or f"anon_{type_id}", (base,), {"_fields_": fields})
        for m in members:
            if getattr(made, m.name).offset != m.bit_offset // 8:
                raise BtfError(f"{t.name}.{m.name}: ctypes places it elsewhere than the C compiler")
        if ctypes.sizeof(made) != t.size_or_type:
            raise BtfError(f"struct {t.name}: {ctypes.sizeof(made)} bytes, {t.size_or_type} in C")
        return made
    raise BtfError(f"type {type_id} ({t.name}): no ctypes type for kind {t.kind}")


@dataclass(frozen=True)
class MapSpec:
    """One map of the object: its kind, capacity and key and value types."""

    name: str
    map_type: int
    max_entries: int
    key: Any  # a ctypes type
    value: Any
    key_type_id: int
    value_type_id: int
    map_flags: int = 0


# BPF_F_NO_PREALLOC: a hash map's entries allocated as they are first written, not all at load.
NO_PREALLOC = 1
# Before 6.1 the kernel refuses such a map in a perf-event program (the sampler uses the stack
# map): there it is preallocated, with fewer entries, as each holds a 256-frame stack (3 KB).
ALLOC_ON_DEMAND_KERNEL = (6, 1)
PREALLOCATED_STACKS = 2048


def kernel_version() -> tuple[int, int]:
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return (0, 0)
    return major, minor


def map_shape(spec: MapSpec, entries: int, kernel: tuple[int, int]) -> tuple[int, int]:
    """(flags, max_entries) the map is created with on this kernel."""
    if spec.map_flags & NO_PREALLOC and kernel < ALLOC_ON_DEMAND_KERNEL:
        return spec.map_flags & ~NO_PREALLOC, min(entries, PREALLOCATED_STACKS)
    return spec.map_flags, entries


def map_specs(btf: Btf) -> dict[str, MapSpec]:
    """Every BTF-defined map of the object (its .maps section), by name."""
    sections = btf.named(".maps", (DATASEC,))
    if not sections:
        raise BtfError("no .maps section in the object's BTF")
    specs = {}
    for var_type, _offset, _size in btf.datasec(sections[0]):
        var = btf[var_type]
        fields = {m.name: m.type_id for m in btf.members(btf.skip_qualifiers(var.size_or_type))}

        def number(name: str, fields: dict[str, int] = fields) -> int:
            pointer = btf[fields[name]]
            return btf.array(pointer.size_or_type)[2]  # __uint(name, N): int (*name)[N]

        def pointee(name: str, fields: dict[str, int] = fields) -> int:
            return btf[fields[name]].size_or_type  # __type(name, T): T *name

        key, value = pointee("key"), pointee("value")
        specs[var.name] = MapSpec(
            var.name,
            number("type"),
            number("max_entries"),
            ctype(btf, key),
            ctype(btf, value),
            key,
            value,
            number("map_flags") if "map_flags" in fields else 0,
        )
    return specs


@lru_cache(maxsize=1)
def maps() -> dict[str, MapSpec]:
    return map_specs(object_btf())


@lru_cache(maxsize=1)
def config_type() -> Any:
    """struct process_config, the one read-only global, as ctypes."""
    btf = object_btf()
    found = btf.named("process_config", (STRUCT,))
    if not found:
        raise BtfError("the object's BTF has no struct process_config")
    return ctype(btf, found[0])


def cost_part(name: str) -> int:
    """A value of the source's enum cost_parts (COST_LOOKUP_ONLY...), as compiled."""
    btf = object_btf()
    found = btf.named("cost_parts", (ENUM,))
    if not found:
        raise BtfError("the object's BTF has no enum cost_parts")
    return btf.enum_values(found[0])[name]


def config_fields() -> tuple[str, ...]:
    return tuple(name for name, _ in config_type()._fields_)


@dataclass(frozen=True)
class Capacities:
    """The logs' sizes, set before load: each entry is kernel memory held for the capture."""

    sample: int = 1 << 17  # 4 MiB: 22 min of two CPUs sampled at 49 Hz
    region: int = 1 << 18  # 10 MiB: 2.5 min at 1 700 regions a second
    slice: int = 1 << 19  # about 12 MiB; 1 turns the log off
    native_stacks: int = 0  # distinct native stacks kept; 0: none taken

    def max_entries(self) -> dict[str, int]:
        return {
            "sample_log": max(1, self.sample),
            "region_log": max(1, self.region),
            "slice_log": max(1, self.slice),
            "native_stacks": max(1, self.native_stacks),
        }


# Counters only (profkit watch): logs of one entry, which nothing writes past.
COUNTERS_ONLY = Capacities(1, 1, 1, 0)


def config_values(
    pid: int, layout: Layout | None, capacities: Capacities, cost_parts: int = 0
) -> dict[str, int]:
    """Every field of the config. Without a layout (an interpreter the walker cannot read) the
    walker is off and its fields are zero."""
    values = dict.fromkeys(config_fields(), 0)
    values.update(
        target_tgid=pid,
        sample_capacity=max(1, capacities.sample),
        region_capacity=max(1, capacities.region),
        slice_capacity=max(1, capacities.slice),
        native_stacks_on=int(capacities.native_stacks > 0),
        cost_parts=cost_parts,
    )
    if layout is None:
        return values
    span = layout.frame_span()
    if span > PY_FRAME_SPAN_MAX:
        raise ValueError(
            f"a frame's fields span {span} bytes, over the program's {PY_FRAME_SPAN_MAX}"
        )
    values.update(
        walker_on=1,
        py_frame_kind=FRAME_KINDS[layout.frame_kind],
        py_tstate_frame=layout.tstate_frame,
        py_cframe_current=max(0, layout.cframe_current_frame),
        py_frame_code=layout.frame_code,
        py_frame_previous=layout.frame_previous,
        py_frame_instr=layout.frame_instr,
        py_frame_owner=layout.frame_owner,
        py_owner_cstack=layout.owner_cstack,
        py_code_adaptive=max(0, layout.code_adaptive),
        py_frame_span=span,
        py_code_tag=layout.code_tag,
    )
    return values


def config_struct(values: Mapping[str, int]) -> ctypes.Structure:
    made: ctypes.Structure = config_type()(**values)
    return made
