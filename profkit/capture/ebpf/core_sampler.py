"""The prebuilt on-CPU sampler and stack walker (probes/core/sampler.bpf.c), loaded through
libbpf where bcc cannot compile: its constant, its maps' types, and the load.

It writes the maps probes/pystack.bpf.c's sampler writes under bcc, with the same layouts,
so the walker's reader (pywalk.PythonWalker.read) and the sample reader serve both.
"""

from __future__ import annotations

import ctypes

from ...host.pyruntime import Layout
from .libbpf import CoreObject, MapType
from .pywalk import FRAME_KINDS

OBJECT = "sampler.bpf.o"
PY_MAX_FRAMES = 32
PY_FRAME_SPAN_MAX = 128  # the program's frame buffer
NATIVE_USER_FRAMES, NATIVE_KERNEL_FRAMES = 48, 24


class SamplerConfig(ctypes.Structure):
    """struct sampler_config, the program's one read-only global."""

    _fields_ = [
        ("target_tgid", ctypes.c_uint32),
        ("sample_capacity", ctypes.c_uint32),
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
}


def config_for(pid: int, layout: Layout, sample_capacity: int, native: bool) -> SamplerConfig:
    span = layout.frame_span()
    if span > PY_FRAME_SPAN_MAX:
        raise ValueError(
            f"a frame's fields span {span} bytes, over the program's {PY_FRAME_SPAN_MAX}"
        )
    return SamplerConfig(
        target_tgid=pid,
        sample_capacity=sample_capacity,
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


def load_sampler(pid: int, layout: Layout, sample_capacity: int, native_stacks: int) -> CoreObject:
    """The sampler loaded for one target, nothing attached yet."""
    return CoreObject(
        OBJECT,
        config_for(pid, layout, sample_capacity, native_stacks > 0),
        {"sample_log": sample_capacity, "native_stacks": max(1, native_stacks)},
        TYPES,
    )
