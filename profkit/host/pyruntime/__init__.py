"""CPython runtime knowledge for walking Python stacks of another process.

Finds the interpreter in a target (shared libpython or a statically linked executable), the
offsets of the structures a stack walker follows for CPython 3.10 to 3.15, the thread states
of its threads, and turns (code object, instruction index) pairs into names and lines.
"""

from __future__ import annotations

from .code import CodeInfo, CodeResolver
from .errors import MemoryReadError, PyRuntimeUnsupported
from .layout import SUPPORTED, Layout, detect
from .threads import thread_states
from .walk import self_check, walk

__all__ = [
    "SUPPORTED",
    "CodeInfo",
    "CodeResolver",
    "Layout",
    "MemoryReadError",
    "PyRuntimeUnsupported",
    "detect",
    "self_check",
    "thread_states",
    "walk",
]
