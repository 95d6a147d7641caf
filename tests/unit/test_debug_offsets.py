"""The layout the interpreter publishes (_Py_DebugOffsets), read from the bytes real 3.13, 3.14
and 3.15 interpreters hold at the start of _PyRuntime (pyenv's 3.13.0, Debian sid's 3.14.10 and
3.15.2, saved in tests/data/debug_offsets): the offsets the walker needs come out as each
version's headers put them, and a table that is not what its version says is refused."""

from __future__ import annotations

import struct
from typing import cast

import pytest

from profkit.host.pyruntime.errors import PyRuntimeUnsupported
from profkit.host.pyruntime.layout import DEBUG_SECTIONS, _debug_offsets_layout
from profkit.host.pyruntime.memory import ProcessMemory

from ..support import DATA

RUNTIME = 0x1000
VERSIONS = {(3, 13): 0x030D00F0, (3, 14): 0x030E0AF0, (3, 15): 0x030F02F0}


class Memory:
    """What ProcessMemory.read gives for the bytes saved from a live interpreter."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def read(self, address: int, size: int) -> bytes:
        start = address - RUNTIME
        assert start >= 0 and start + size <= len(self.raw), (address, size)
        return self.raw[start : start + size]


def memory(raw: bytes) -> ProcessMemory:
    return cast("ProcessMemory", Memory(raw))


def saved(version: tuple[int, int]) -> bytes:
    return (DATA / "debug_offsets" / f"{version[0]}.{version[1]}.bin").read_bytes()


@pytest.mark.parametrize(
    ("version", "frame_owner", "native_thread_id", "code_adaptive", "code_tag"),
    [((3, 13), 70, 160, 200, 0), ((3, 14), 74, 160, 208, 3), ((3, 15), 74, 184, 208, 3)],
)
def test_each_version_gives_the_offsets_its_headers_have(
    version: tuple[int, int],
    frame_owner: int,
    native_thread_id: int,
    code_adaptive: int,
    code_tag: int,
) -> None:
    fields = _debug_offsets_layout(memory(saved(version)), RUNTIME, VERSIONS[version], version)
    assert fields["tstate_frame"] == 72  # current_frame, in every version
    assert fields["tstate_next"] == 8 and fields["frame_previous"] == 8
    assert fields["frame_code"] == 0 and fields["frame_instr"] == 56
    assert fields["frame_owner"] == frame_owner
    assert fields["tstate_native_thread_id"] == native_thread_id
    assert fields["code_adaptive"] == code_adaptive
    assert fields["code_tag"] == code_tag
    assert (fields["code_filename"], fields["code_name"], fields["code_qualname"]) == (
        112,
        120,
        128,
    )
    assert fields["code_firstlineno"] == 68 and fields["code_linetable"] == 136
    assert fields["ob_type"] == 8 and fields["unicode_ascii_size"] == 40


def test_a_free_threaded_build_is_refused_in_one_line() -> None:
    raw = bytearray(saved((3, 14)))
    struct.pack_into("<Q", raw, 16, 1)  # free_threaded
    with pytest.raises(
        PyRuntimeUnsupported, match="free-threaded CPython builds are not supported"
    ):
        _debug_offsets_layout(memory(bytes(raw)), RUNTIME, VERSIONS[(3, 14)], (3, 14))


@pytest.mark.parametrize(
    ("saved_as", "read_as"), [((3, 15), (3, 14)), ((3, 14), (3, 13)), ((3, 14), (3, 15))]
)
def test_a_table_of_another_shape_is_refused(
    saved_as: tuple[int, int], read_as: tuple[int, int]
) -> None:
    """A table read with another version's section positions (as a patch release or a
    pre-release whose table moved would be) fails the section checks: refused, not misread."""
    raw = saved(saved_as)
    if len(raw) < DEBUG_SECTIONS[read_as].read:
        raw += bytes(DEBUG_SECTIONS[read_as].read - len(raw))
    version_hex = (VERSIONS[read_as] & ~0xFFFF_0000) | (read_as[0] << 24) | (read_as[1] << 16)
    raw = raw[:8] + struct.pack("<Q", version_hex) + raw[16:]
    with pytest.raises(PyRuntimeUnsupported, match="inconsistent"):
        _debug_offsets_layout(memory(raw), RUNTIME, version_hex, read_as)


def test_a_version_that_is_not_the_interpreters_is_refused() -> None:
    with pytest.raises(PyRuntimeUnsupported, match="differs from Py_Version"):
        _debug_offsets_layout(memory(saved((3, 14))), RUNTIME, VERSIONS[(3, 15)], (3, 14))


def test_the_layout_says_its_version_in_full() -> None:
    from profkit.host.pyruntime import Layout

    fields = _debug_offsets_layout(memory(saved((3, 14))), RUNTIME, VERSIONS[(3, 14)], (3, 14))
    layout = Layout(version=(3, 14), source="_Py_DebugOffsets", runtime_addr=RUNTIME, **fields)
    assert (
        Layout(**{**layout.__dict__, "full_version": VERSIONS[(3, 14)]}).version_text == "3.14.10"
    )
    beta = Layout(**{**layout.__dict__, "full_version": 0x030E00B4})
    assert beta.version_text == "3.14.0b4"
