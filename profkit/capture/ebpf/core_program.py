"""The prebuilt process program (probes/core/process.bpf.c: the on-CPU sampler, the stack
walker and the parallel-region probes), loaded through libbpf where bcc cannot compile: its
constant, its maps' types, and the load.

It writes the maps probes/pystack.bpf.c and probes/openmp.bpf.c write under bcc, with the same
layouts, so the walker's reader (pywalk.PythonWalker.read), the sample reader and the region
reader serve both.
"""

from __future__ import annotations

import ctypes

from ...host.pyruntime import Layout
from .libbpf import CoreObject, MapType
from .pywalk import FRAME_KINDS

OBJECT = "process.bpf.o"
PY_MAX_FRAMES = 32
PY_FRAME_SPAN_MAX = 128  # the program's frame buffer
NATIVE_USER_FRAMES, NATIVE_KERNEL_FRAMES = 48, 24


class ProcessConfig(ctypes.Structure):
    """struct process_config, the program's one read-only global."""

    _fields_ = [
        ("target_tgid", ctypes.c_uint32),
        ("sample_capacity", ctypes.c_uint32),
        ("region_capacity", ctypes.c_uint32),
        ("slice_capacity", ctypes.c_uint32),
        ("native_stacks_on", ctypes.c_uint32),
        ("py_frame_kind", ctypes.c_uint32),
        ("py_tstate_frame", ctypes.c_uint32),
        ("py_cframe_current", ctypes.c_uint32),
        ("py_frame_code", ctypes.c_uint32),
        ("py_frame_previous", ctypes.c_uint32),
        ("py_frame_instr", ctypes.c_uint32),
        ("py_frame_owner", ctypes.c_int32),
        ("py_owner_cstack", ctypes.c_int32),
        ("py_code_adaptive", ctypes.c_uint32),
        ("py_frame_span", ctypes.c_uint32),
    ]


class PyStack(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint64 * PY_MAX_FRAMES),
        ("instr", ctypes.c_uint32 * PY_MAX_FRAMES),
        ("depth", ctypes.c_uint32),
        ("truncated", ctypes.c_uint32),
    ]


class PyStackKey(ctypes.Structure):
    _fields_ = [("stack", ctypes.c_uint64), ("runtime", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class PyStackStats(ctypes.Structure):
    _fields_ = [("regions", ctypes.c_uint64), ("region_ns", ctypes.c_uint64)]


class PySample(ctypes.Structure):
    _fields_ = [
        ("t_ns", ctypes.c_uint64),
        ("stack", ctypes.c_uint64),
        ("native", ctypes.c_uint64),
        ("tid", ctypes.c_uint32),
        ("python", ctypes.c_uint32),
        ("dispatcher", ctypes.c_uint32),
        ("dispatch", ctypes.c_uint32),
    ]


class NStack(ctypes.Structure):
    _fields_ = [
        ("user", ctypes.c_uint64 * NATIVE_USER_FRAMES),
        ("kernel", ctypes.c_uint64 * NATIVE_KERNEL_FRAMES),
        ("user_depth", ctypes.c_uint32),
        ("kernel_depth", ctypes.c_uint32),
    ]


class RegionStart(ctypes.Structure):
    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("stack", ctypes.c_uint64),
        ("requested", ctypes.c_uint32),
        ("runtime", ctypes.c_uint32),
    ]


class Region(ctypes.Structure):
    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("end_ns", ctypes.c_uint64),
        ("stack", ctypes.c_uint64),
        ("tid", ctypes.c_uint32),
        ("requested", ctypes.c_uint32),
        ("runtime", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class ThreadTime(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "oncpu_ns",
            "offcpu_ns",
            "last_in_ns",
            "last_out_ns",
            "voluntary",
            "involuntary",
            "off_stack",
        )
    ]


class OffcpuKey(ctypes.Structure):
    _fields_ = [("stack", ctypes.c_uint64), ("tid", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class OffcpuTime(ctypes.Structure):
    _fields_ = [("ns", ctypes.c_uint64), ("switches", ctypes.c_uint64)]


class WakeKey(ctypes.Structure):
    _fields_ = [("waker", ctypes.c_uint32), ("wakee", ctypes.c_uint32)]


class Slice(ctypes.Structure):
    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("end_ns", ctypes.c_uint64),
        ("tid", ctypes.c_uint32),
        ("voluntary", ctypes.c_uint32),
    ]


U32, U64 = ctypes.c_uint32, ctypes.c_uint64
TYPES = {
    "tstates": MapType(U32, U64),
    "pystacks": MapType(U64, PyStack),
    "pystack_stats": MapType(PyStackKey, PyStackStats),
    "walk_counts": MapType(U32, U64),
    "sample_log": MapType(U32, PySample),
    "sample_count": MapType(U32, U64),
    "sole_python": MapType(U32, U32),
    "woken_by": MapType(U32, U32),
    "native_stacks": MapType(U64, NStack),
    "native_counts": MapType(U32, U64),
    "open_regions": MapType(U32, RegionStart),
    "duration_us_log2": MapType(U32, U64),
    "region_log": MapType(U32, Region),
    "region_count": MapType(U32, U64),
    "runtime_entries": MapType(U32, U64),
    "times": MapType(U32, ThreadTime),
    "wakeups": MapType(WakeKey, U64),
    "slice_log": MapType(U32, Slice),
    "slice_count": MapType(U32, U64),
    "pystack_offcpu": MapType(OffcpuKey, OffcpuTime),
}

# The scheduler programs and the tracepoint each is on.
SCHED_PROGRAMS = {
    "on_switch": "sched_switch",
    "on_wakeup": "sched_wakeup",
    "on_wakeup_new": "sched_wakeup_new",
}

# An entry attachment's cookie: the copy's index below, where the team size is above.
COOKIE_COPY_BITS = 16


def entry_cookie(runtime: int, requested_arg: int) -> int:
    return runtime | (requested_arg << COOKIE_COPY_BITS)


def config_for(
    pid: int,
    layout: Layout | None,
    sample_capacity: int,
    region_capacity: int,
    slice_capacity: int,
    native: bool,
) -> ProcessConfig:
    """The program's constant. Without a layout (an interpreter the walker cannot read) the
    walker's part is zero: no thread state is ever given it, so it never walks."""
    capacities = ProcessConfig(
        target_tgid=pid,
        sample_capacity=sample_capacity,
        region_capacity=region_capacity,
        slice_capacity=slice_capacity,
        native_stacks_on=int(native),
    )
    if layout is None:
        return capacities
    span = layout.frame_span()
    if span > PY_FRAME_SPAN_MAX:
        raise ValueError(
            f"a frame's fields span {span} bytes, over the program's {PY_FRAME_SPAN_MAX}"
        )
    return ProcessConfig(
        target_tgid=pid,
        sample_capacity=sample_capacity,
        region_capacity=region_capacity,
        slice_capacity=slice_capacity,
        native_stacks_on=int(native),
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
    )


# The region probes' programs: linked many points to a link where the kernel can.
UPROBE_PROGRAMS = ("on_region_entry", "on_region_return")


def load_process(
    pid: int,
    layout: Layout | None,
    sample_capacity: int,
    region_capacity: int,
    slice_capacity: int,
    native_stacks: int,
) -> CoreObject:
    """The process program loaded for one target, nothing attached yet."""
    return CoreObject(
        OBJECT,
        config_for(
            pid, layout, sample_capacity, region_capacity, slice_capacity, native_stacks > 0
        ),
        {
            "sample_log": sample_capacity,
            "region_log": region_capacity,
            "slice_log": slice_capacity,
            "native_stacks": max(1, native_stacks),
        },
        TYPES,
        uprobe_programs=UPROBE_PROGRAMS,
    )
