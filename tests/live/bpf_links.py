"""The machine's BPF links as the kernel describes them, read with the bpf system call itself
(bpftool 7.1 shows no multi-uprobe link's file): what a test checks a capture attached, from the
kernel's side rather than profkit's."""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_LINK_GET_FD_BY_ID = 30
BPF_LINK_GET_NEXT_ID = 31
BPF_LINK_TYPE_UPROBE_MULTI = 12

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _IdAttr(ctypes.Structure):
    # union bpf_attr for *_GET_NEXT_ID and *_GET_FD_BY_ID: start_id (or link_id), next_id.
    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_uint32), ("len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class _UprobeMulti(ctypes.Structure):
    # struct bpf_link_info's uprobe_multi member (linux/bpf.h, 6.8 on).
    _fields_ = [
        ("path", ctypes.c_uint64),
        ("offsets", ctypes.c_uint64),
        ("ref_ctr_offsets", ctypes.c_uint64),
        ("cookies", ctypes.c_uint64),
        ("path_size", ctypes.c_uint32),
        ("count", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
    ]


class _LinkInfo(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("prog_id", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("uprobe_multi", _UprobeMulti),
        ("_rest", ctypes.c_uint8 * 64),
    ]


@dataclass(frozen=True)
class UprobeLink:
    path: str  # the probed file as the kernel names it (d_path of its inode's dentry)
    pid: int
    count: int


def _bpf(command: int, attr: ctypes.Structure) -> int:
    return int(
        _libc.syscall(
            ctypes.c_long(SYS_BPF[platform.machine()]),
            ctypes.c_int(command),
            ctypes.byref(attr),
            ctypes.c_uint(ctypes.sizeof(attr)),
        )
    )


def uprobe_multi_links() -> list[UprobeLink]:
    """Every multi-uprobe link on the machine, with the file it probes."""
    found: list[UprobeLink] = []
    current = 0
    while True:
        attr = _IdAttr(current, 0, 0)
        if _bpf(BPF_LINK_GET_NEXT_ID, attr) < 0:
            return found
        current = attr.next_id
        fd = _bpf(BPF_LINK_GET_FD_BY_ID, _IdAttr(current, 0, 0))
        if fd < 0:
            continue  # gone meanwhile
        try:
            path = ctypes.create_string_buffer(4096)
            info = _LinkInfo()
            info.uprobe_multi.path = ctypes.addressof(path)
            info.uprobe_multi.path_size = len(path)
            request = _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info))
            if _bpf(BPF_OBJ_GET_INFO_BY_FD, request) < 0:
                continue
            if info.type == BPF_LINK_TYPE_UPROBE_MULTI:
                found.append(
                    UprobeLink(
                        path.value.decode(errors="replace"),
                        int(info.uprobe_multi.pid),
                        int(info.uprobe_multi.count),
                    )
                )
        finally:
            os.close(fd)
