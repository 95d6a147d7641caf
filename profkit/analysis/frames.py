"""Reading meaning out of frame names: OpenMP runtime frames, ATen ops and kernels, the kernel."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..bundle.frames import Frame

OPENMP_DSOS = re.compile(r"lib(gomp|iomp5|omp)[^/]*\.so")
OPENMP_FORK = re.compile(r"^(GOMP_parallel\w*|__kmpc_fork_call|at::internal::invoke_parallel)")
OPENMP_WAIT = re.compile(
    r"(gomp_(team_)?barrier_wait|gomp_thread_start|do_spin|do_wait|"
    r"__kmp_(wait|hyper_barrier|fork_barrier|join_barrier|suspend)|"
    r"GOMP_barrier)"
)
# Where OpenBLAS's server threads wait between calls: their own loop, yielding the CPU, not an
# OpenMP barrier. A sample whose innermost user frame is this loop is the pool idling.
BLAS_IDLE = re.compile(r"^blas_thread_server$")
POOL_DSOS = {
    "openblas": re.compile(r"openblas[^/]*\.so"),
    "mkl": re.compile(r"libmkl_[^/]*\.so"),
    "tbb": re.compile(r"libtbb[^/]*\.so"),
}
ATEN_PARALLEL = re.compile(r"at::internal::(invoke_parallel|serial_for_each)|at::parallel_for")
ATEN_OP = re.compile(r"at::_ops::(\w+?)::(call|redispatch)")
THP_OP = re.compile(r"THPVariable_(\w+)")
ATEN_KERNEL = re.compile(r"at::native::(?:\w+::)?(\w+_kernel)\b")
KERNEL_DSO = "[kernel.kallsyms]"
PAGE_FAULT = re.compile(
    r"page_fault|handle_mm_fault|shmem_fault|clear_page|do_anonymous_page|"
    r"filemap_fault|__do_fault|alloc_pages"
)
TLB = re.compile(r"flush_tlb|tlb_|smp_call_function|native_flush")
SCHEDULER = re.compile(
    r"^(schedule|__schedule|finish_task_switch|futex|do_futex|"
    r"__x64_sys_futex|try_to_wake_up|sched_|pick_next)"
)
# Kernels ATen runs for an op, to name the op from worker stacks when the dispatcher's are missing.
KERNEL_OPS = {
    "direct_copy_kernel": "aten::copy_",
    "copy_kernel": "aten::copy_",
    "fill_kernel": "aten::fill_",
    "add_kernel": "aten::add",
}


def is_openmp_frame(name: str, file: str) -> bool:
    return bool(OPENMP_DSOS.search(file) or OPENMP_FORK.match(name))


def aten_op(names: list[str]) -> str | None:
    """The op the Python code called: the outermost at::_ops frame (or THPVariable_ binding)."""
    for name in names:  # root first: the first match is the outermost
        match = ATEN_OP.search(name)
        if match:
            return f"aten::{match.group(1)}"
    for name in names:
        match = THP_OP.search(name)
        if match:
            return f"aten::{match.group(1)}"
    return None


def aten_kernel(name: str) -> str | None:
    match = ATEN_KERNEL.search(name)
    return match.group(1) if match else None


def kernel_kind(names: list[str]) -> str:
    """Page faults, TLB shootdowns or scheduling, from a kernel stack (any order)."""
    joined = " ".join(names)
    if PAGE_FAULT.search(joined):
        return "page_faults"
    if TLB.search(joined):
        return "tlb"
    if any(SCHEDULER.match(n) for n in names):
        return "scheduler"
    return "other_kernel"


# Code that is not the program's own: the interpreter's standard library (lib/pythonX.Y, frozen
# modules) and installed packages (site- and dist-packages). What is neither is the user's.
INSTALLED_CODE = re.compile(r"/(?:site|dist)-packages/")
STANDARD_LIBRARY = re.compile(r"/lib/python\d+(?:\.\d+)?t?/|^<frozen |^<string>$")


def is_user_code(frame: Frame) -> bool:
    """A Python frame of the program's own code: not the standard library, not a package."""
    return (
        frame.is_python
        and bool(frame.file)
        and not frame.file.startswith("<")
        and not INSTALLED_CODE.search(frame.file)
        and not STANDARD_LIBRARY.search(frame.file)
    )


def user_frame(stack: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the program's own code in a stack (outermost first): the line of
    the user's that led to the site, where the stack has one."""
    return next((f for f in reversed(stack) if is_user_code(f)), None)
