"""The process program through bcc, for kernels without BTF: text made from the one source
(bcc_source.py), compiled for the target, its region probes attached by bcc.

Debian's bcc bindings are imported from any interpreter, without the unrelated PyPI package
`bcc`: python3-bpfcc installs pure-Python bindings over libbcc under the system dist-packages. A
virtualenv does not see them, and adding the whole system dist-packages to sys.path would mix in
every other system package, so only the `bcc` package directory is loaded, by path.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, TypeAlias

from .. import program
from ..placement.regions import Uprobe
from . import LoaderName, LoaderUnavailable, LoadRequest
from .bcc_source import entry_handler, translate

SYSTEM_BCC_DIRS = (
    Path("/usr/lib/python3/dist-packages/bcc"),
    Path("/usr/local/lib/python3/dist-packages/bcc"),
)


# bcc ships no type stubs: a loaded program (bcc.BPF) and the tables it is indexed by are
# typed as this wherever profkit holds one.
BpfProgram: TypeAlias = Any


class BccUnavailable(LoaderUnavailable):
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
    """Make bcc register its uprobes without a USDT semaphore, as the CO-RE loader does.

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


def source_text(request: LoadRequest) -> str:
    """bcc's text of the process program for this request."""
    return translate(
        program.probe_file(program.SOURCE).decode(),
        program.probe_file(program.WALK_HEADER).decode(),
        program.config_values(request.pid, request.layout, request.capacities, request.cost_parts),
        request.capacities.max_entries(),
        request.entry_cookies,
        request.sched,
    )


def load_bcc_program(request: LoadRequest) -> BccProgram:
    text = source_text(request)
    if request.print_source:
        print(f"/* --- the process program, as bcc compiles it for pid {request.pid} --- */")
        print(text)
    bcc = load_bcc()
    return BccProgram(bcc, bcc.BPF(text=text), request)


# bcc's names of the scheduler's tracepoint programs (TRACEPOINT_PROBE), attached as they load.
SCHED_TRACEPOINTS = ("sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new")
WAKING_TRACEPOINT = "sched:sched_waking"


class BccProgram:
    """The process program compiled by bcc (loaders.Program)."""

    name: LoaderName = "bcc"
    uprobe_links = "single"

    def __init__(self, bcc: ModuleType, bpf: BpfProgram, request: LoadRequest) -> None:
        self._bcc, self._bpf, self._pid = bcc, bpf, request.pid
        self._runtimes = request.runtimes
        self._events: dict[bool, set[bytes]] = {True: set(), False: set()}
        self._sched = request.sched
        # TRACEPOINT_PROBE programs are attached as bcc loads them; off until asked for.
        self._sched_on = bool(request.sched)
        self.detach_sched()

    def __getitem__(self, map_name: str) -> Any:
        return self._bpf[map_name]

    def attach_sampler(self, frequency_hz: int) -> None:
        self._bpf.attach_perf_event(
            ev_type=self._bcc.PerfType.SOFTWARE,
            ev_config=self._bcc.PerfSWConfig.CPU_CLOCK,
            fn_name=program.SAMPLER,
            sample_freq=frequency_hz,
        )

    def attach_sched(self, waking: bool) -> list[str]:
        if not self._sched:
            raise LoaderUnavailable("the scheduler's programs were not compiled in")
        points = [*SCHED_TRACEPOINTS, *([WAKING_TRACEPOINT] if waking else [])]
        for point in points:
            category, event = point.split(":")
            self._bpf.attach_tracepoint(tp=point, fn_name=f"tracepoint__{category}__{event}")
        self._sched_on = True
        return [f"tracepoint:{point}" for point in points]

    def detach_sched(self) -> None:
        if not self._sched_on:
            return
        for point in (*SCHED_TRACEPOINTS, WAKING_TRACEPOINT):
            with contextlib.suppress(Exception):
                self._bpf.detach_tracepoint(tp=point)
        self._sched_on = False

    def attach_regions(self, probes: Sequence[Uprobe]) -> None:
        added: dict[bool, set[bytes]] = {True: set(), False: set()}
        try:
            for probe in probes:
                before = set(self._bpf.uprobe_fds)
                where: dict[str, object] = {"name": probe.target_path(), "pid": self._pid}
                if probe.address is not None:
                    where["addr"] = probe.address
                else:
                    where["sym"] = probe.symbol
                kind = "uretprobe" if probe.retprobe else "uprobe"
                handler = entry_handler(probe.runtime) if probe.entry else program.REGION_END
                getattr(self._bpf, f"attach_{kind}")(fn_name=handler, **where)
                added[probe.entry] |= set(self._bpf.uprobe_fds) - before
        except Exception:
            with contextlib.suppress(Exception):
                detach_uprobes(self._bpf, added[True] | added[False])
            raise
        for entry, events in added.items():
            self._events[entry] |= events

    def detach_regions(self, entries: bool) -> None:
        events, self._events[entries] = self._events[entries], set()
        if events:
            detach_uprobes(self._bpf, events)

    def attach_calibration(self, path: str, address: int, file_offset: int) -> object:
        before = set(self._bpf.uprobe_fds)
        self._bpf.attach_uprobe(name=path, addr=address, fn_name=program.CALIBRATE, pid=os.getpid())
        return set(self._bpf.uprobe_fds) - before

    def detach_calibration(self, handle: object) -> None:
        if isinstance(handle, set) and handle:
            detach_uprobes(self._bpf, handle)

    def run_stats(self, programs: Sequence[str]) -> tuple[int, int]:
        runs = nanoseconds = 0
        for name in programs:
            function = self._bpf.funcs.get(name.encode())
            if function is None:
                continue
            found = program_run_stats(function.fd)
            runs, nanoseconds = runs + found[0], nanoseconds + found[1]
        return runs, nanoseconds

    def entry_programs(self) -> list[str]:
        return [entry_handler(i) for i in range(self._runtimes)]

    def record(self, reason: str) -> dict[str, object]:
        return {"name": "bcc", "version": f"bcc {bcc_version()}", "reason": reason}

    def detach(self) -> None:
        """bcc's probes go at close(): detaching them here would hold the reading up."""

    def close(self, wait: bool = False) -> None:
        with contextlib.suppress(Exception):
            detach_uprobes(self._bpf)
        with contextlib.suppress(Exception):
            self._bpf.cleanup()


def program_run_stats(fd: int) -> tuple[int, int]:
    """(runs, nanoseconds) of a loaded program, from its descriptor's fdinfo; (0, 0) where the
    kernel keeps no statistics (BPF_ENABLE_STATS off, or a kernel before 5.1)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/self/fdinfo/{fd}") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key in ("run_cnt", "run_time_ns"):
                    fields[key] = int(value)
    except (OSError, ValueError):
        return 0, 0
    return fields.get("run_cnt", 0), fields.get("run_time_ns", 0)
