"""Reading another process's memory: process_vm_readv first, /proc/PID/mem as the fallback."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable

from .errors import MemoryReadError

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


def _load_readv() -> Callable[..., int] | None:
    try:
        # The C library this interpreter already loaded: find_library would run ldconfig.
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_ssize_t
    func.argtypes = (
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    )
    return func


_process_vm_readv = _load_readv()


class ProcessMemory:
    """Byte reads from one target process.

    process_vm_readv needs no file descriptor and does not stop the target; some sandboxes
    forbid it (seccomp, EPERM), so /proc/PID/mem is tried once it fails for a reason other than
    an unmapped address.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._use_readv = _process_vm_readv is not None
        self._mem_fd: int | None = None

    def close(self) -> None:
        if self._mem_fd is not None:
            os.close(self._mem_fd)
            self._mem_fd = None

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, addr: int, size: int) -> bytes:
        if size <= 0:
            return b""
        if addr <= 0 or addr + size > 1 << 64:
            raise MemoryReadError(self.pid, addr, size, "invalid address")
        if self._use_readv:
            data = self._readv(addr, size)
            if data is not None:
                return data
        return self._read_procmem(addr, size)

    def _readv(self, addr: int, size: int) -> bytes | None:
        assert _process_vm_readv is not None
        buf = ctypes.create_string_buffer(size)
        local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), size)
        remote = _IoVec(addr, size)
        got = _process_vm_readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got == size:
            return buf.raw
        err = ctypes.get_errno() if got < 0 else 0
        if got >= 0 or err == errno.EFAULT:
            # A short read or EFAULT means the range is (partly) unmapped: /proc/PID/mem would
            # fail the same way, so report it directly.
            raise MemoryReadError(self.pid, addr, size, "address not mapped")
        if err == errno.ESRCH:
            raise MemoryReadError(self.pid, addr, size, "process is gone")
        # EPERM/ENOSYS and friends: the syscall itself is unavailable here; use the file.
        self._use_readv = False
        return None

    def _read_procmem(self, addr: int, size: int) -> bytes:
        try:
            if self._mem_fd is None:
                self._mem_fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(self._mem_fd, size, addr)
        except OSError as exc:
            raise MemoryReadError(self.pid, addr, size, exc.strerror or str(exc)) from exc
        if len(data) != size:
            raise MemoryReadError(self.pid, addr, size, "address not mapped")
        return data

    def u64(self, addr: int) -> int:
        return _U64.unpack(self.read(addr, 8))[0]

    def u32(self, addr: int) -> int:
        return _U32.unpack(self.read(addr, 4))[0]

    def i32(self, addr: int) -> int:
        return _I32.unpack(self.read(addr, 4))[0]

    def u8(self, addr: int) -> int:
        return self.read(addr, 1)[0]


def u64_at(data: bytes, offset: int) -> int:
    return _U64.unpack_from(data, offset)[0]


def u32_at(data: bytes, offset: int) -> int:
    return _U32.unpack_from(data, offset)[0]


def i32_at(data: bytes, offset: int) -> int:
    return _I32.unpack_from(data, offset)[0]
