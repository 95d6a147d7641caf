"""The frame of a stack, as every part of profkit names one: the capture writes frames, the
bundle's readers and the analysis read them, watch shows them. Kept apart from read.py so that
a capture need not import what the reading needs (numpy)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    """A frame of a stack, Python or native, as every part of profkit names one."""

    file: str  # a .py path for Python frames, the DSO path for native ones
    function: str  # the function's qualified name, or the native symbol
    line: int  # 0 where none (native frames)
    code: str | None = None  # the source line, read from the target's file at capture

    @property
    def is_python(self) -> bool:
        return self.file.endswith(".py")

    @property
    def label(self) -> str:
        return f"{self.file}:{self.line}"
