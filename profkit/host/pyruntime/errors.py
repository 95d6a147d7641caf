"""Exceptions shared by the CPython runtime-inspection modules."""

from __future__ import annotations


class PyRuntimeUnsupported(Exception):
    """The target's interpreter cannot be walked; ``str(exc)`` is a one-line reason."""


class MemoryReadError(OSError):
    """A read of target memory failed (unmapped address, process gone, no permission)."""

    def __init__(self, pid: int, addr: int, size: int, reason: str) -> None:
        super().__init__(f"pid {pid}: cannot read {size} bytes at {addr:#x}: {reason}")
        self.pid = pid
        self.addr = addr
        self.size = size
