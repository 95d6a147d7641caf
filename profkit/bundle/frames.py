"""The frame of a stack, as every part of profkit names one: the capture writes frames, the
bundle's readers and the analysis read them, watch shows them. Kept apart from read.py so that
a capture need not import what the reading needs (numpy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .names import shown


@dataclass(frozen=True)
class Frame:
    """A frame of a stack, Python or native, as every part of profkit names one. Its names are
    the target's, so they are kept as shown() makes them (bundle/names.py): whatever output a
    frame reaches, its names carry no control character and have a bounded length."""

    file: str  # a .py path for Python frames, the DSO path for native ones
    function: str  # the function's qualified name, or the native symbol
    line: int  # 0 where none (native frames)
    code: str | None = None  # the source line, read from the target's file at capture
    # True for a frame the Python stack walker read (a code object, whatever its file's
    # name); None where a mixed stack's frame is told by its file (py-spy --native).
    python: bool | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("file", "function", "code"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, shown(value))

    def located(self) -> Frame:
        """The frame without its source line: where it is, as a site is named."""
        return Frame(self.file, self.function, self.line, python=self.python)

    @property
    def is_python(self) -> bool:
        if self.python is not None:
            return self.python
        return self.file.endswith(".py")

    @property
    def label(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def is_truncation(self) -> bool:
        return self == TRUNCATED_ROOT


# The outermost frame of a stack the walker cut at its bound (docs/collectors.md): cut stacks
# then share one root in every view instead of posing as roots of their own.
TRUNCATED_ROOT = Frame("", "[truncated]", 0, python=False)
