"""Import Debian's bcc bindings from any interpreter, without the unrelated PyPI package `bcc`.

python3-bpfcc installs pure-Python bindings over libbcc under the system dist-packages. A
virtualenv does not see them, and adding the whole system dist-packages to sys.path would mix in
every other system package, so only the `bcc` package directory is loaded, by path.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, TypeAlias

SYSTEM_BCC_DIRS = (
    Path("/usr/lib/python3/dist-packages/bcc"),
    Path("/usr/local/lib/python3/dist-packages/bcc"),
)


# bcc ships no type stubs: a loaded program (bcc.BPF) and the tables it is indexed by are
# typed as this wherever profkit holds one.
BpfProgram: TypeAlias = Any


class BccUnavailable(ImportError):
    """bcc cannot be imported; the message says why and how to fix it."""


def load_bcc() -> ModuleType:
    module = _import_bcc()
    pass_no_ref_ctr_offset(module)
    return module


def bcc_version() -> str:
    """The bcc bindings' version, "unknown" where they do not say or do not load."""
    try:
        return str(getattr(_import_bcc(), "__version__", "unknown"))
    except BccUnavailable:
        return "unknown"


def _import_bcc() -> ModuleType:
    if os.environ.get("PROFKIT_DISABLE_BCC"):
        raise BccUnavailable("bcc disabled by PROFKIT_DISABLE_BCC")
    existing = sys.modules.get("bcc")
    if existing is not None and hasattr(existing, "BPF"):
        return existing
    for directory in SYSTEM_BCC_DIRS:
        init = directory / "__init__.py"
        if not init.exists():
            continue
        spec = importlib.util.spec_from_file_location(
            "bcc", init, submodule_search_locations=[str(directory)]
        )
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["bcc"] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # libbcc missing or incompatible: say so, do not crash
            sys.modules.pop("bcc", None)
            raise BccUnavailable(f"bcc bindings at {directory} failed to load: {exc}") from exc
        return module
    try:
        module = importlib.import_module("bcc")
    except ImportError as exc:
        raise BccUnavailable(
            "bcc is not installed (apt-get install bpfcc-tools python3-bpfcc; "
            "never `pip install bcc`, an unrelated package)"
        ) from exc
    if not hasattr(module, "BPF"):
        raise BccUnavailable(
            "the `bcc` module on the path is not the BPF Compiler Collection "
            "(PyPI's `bcc` is unrelated: pip uninstall bcc)"
        )
    return module


def pass_no_ref_ctr_offset(module: ModuleType) -> None:
    """Make bcc register its uprobes without a USDT semaphore, as libbpf does.

    bcc's Python bindings (0.26 among them) declare libbcc's bpf_attach_uprobe with six
    arguments while the C function takes seven, the last the semaphore's file offset
    (ref_ctr_offset): every uprobe went in with whatever the seventh argument's slot held. The
    kernel refuses a second probe at the same instruction with another offset (EINVAL,
    "ref_ctr_offset mismatch"), so a bcc capture and a CO-RE capture, or profkit and another
    tracer, could not probe one library at the same time; and a stray offset that lands in a
    writable mapping of the library is a counter the kernel increments there."""
    lib = getattr(getattr(module, "libbcc", None), "lib", None)
    declared = getattr(getattr(lib, "bpf_attach_uprobe", None), "argtypes", None)
    if lib is None or declared is None or len(declared) != 6:
        return  # bindings that pass the offset themselves, or already mended
    full = lib["bpf_attach_uprobe"]  # a function pointer of its own, typed in full below
    full.restype = ctypes.c_int
    full.argtypes = [*declared, ctypes.c_uint32]

    def attach_uprobe(*args: Any) -> int:
        return int(full(*args, 0))

    lib.bpf_attach_uprobe = attach_uprobe


def detach_uprobes(bpf: BpfProgram, names: set[bytes] | None = None) -> None:
    """Detach every uprobe of a loaded program at once. Closing a uprobe's perf event waits in
    the kernel for an RCU grace period, and bcc's cleanup() closes them one after another, so
    the waits add up over a program with a probe on each entry point and return of every
    runtime copy (docs/results/own-cost.md#teardown). libbcc's calls release the GIL, so
    closed from a thread each, the waits can overlap. bcc.BPF.cleanup() then finds none left.
    `names`: only these events (bcc's names, as in bpf.uprobe_fds)."""
    lib = load_bcc().libbcc.lib
    events = [(n, fd) for n, fd in bpf.uprobe_fds.items() if names is None or n in names]
    if not events:
        return

    def close(event: tuple[bytes, int]) -> None:
        name, fd = event
        lib.bpf_close_perf_event_fd(fd)
        lib.bpf_detach_uprobe(name)

    with ThreadPoolExecutor(max_workers=min(32, len(events))) as pool:
        list(pool.map(close, events))
    for name, _ in events:
        bpf._del_uprobe_fd(name)
