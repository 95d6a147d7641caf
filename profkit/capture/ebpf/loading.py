"""The target's process program loaded through either loader, behind one interface: a request
says what to load (the walker, the sampler and its rate, the scheduler tracepoints, logs or only
counters), and the loader returns a Loaded whose maps are read by name, whose region probes
switch through RegionProbes, and which closes itself. The collector decides what to ask for;
nothing here decides.

CO-RE loads the prebuilt object through libbpf (core_program.py), nothing compiled; bcc
compiles the sources for this target (programs.py). Each program's probe points are found
(disassembly, a fraction of a second per runtime) while the program loads: the caller passes
them as futures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

from ...host import procfs
from ...host.target import Runtime
from . import libbpf
from .core_program import SCHED_PROGRAMS, load_process
from .libbpf import CoreObject
from .loader import BpfProgram, bcc_version, detach_uprobes, load_bcc
from .programs import OpenMPProgram, SchedProgram
from .pywalk import PythonWalker
from .region_probes import BccRegionProbes, CoreRegionProbes, RegionProbes
from .regions import RuntimeProbes

LoaderName = Literal["core", "bcc"]
SAMPLER = "on_cpu_sample"


@dataclass(frozen=True)
class LoadRequest:
    """What one target's program is to hold."""

    pid: int
    runtimes: tuple[Runtime, ...]  # the copies whose region entry points are known
    walker: PythonWalker | None  # prepared with a layout, or None: no Python stacks
    walker_flags: tuple[str, ...]  # bcc's defines for the walker's layout
    sched: bool  # the scheduler tracepoints (and, with the sampler, who wakes the workers)
    sample_hz: int  # the on-CPU sampler's rate; 0: no sampler
    native: bool  # the sampler takes native stacks (NATIVE_STACK_ENTRIES of them)
    native_stacks: int
    logs: bool = True  # False: counters only (profkit watch), logs of one entry
    print_source: bool = False  # bcc's source printed before it compiles (--print-programs)


@dataclass
class Loaded:
    """One loaded process program and what went on with it."""

    name: LoaderName
    program: BpfProgram  # bcc's BPF or the CoreObject: both read by map name
    regions: RegionProbes
    probes: list[RuntimeProbes]  # every copy's points, found; the caller attaches them
    attached: list[str] = field(default_factory=list)
    sampling: bool = False
    sched: bool = False
    uprobe_links: str = "single"  # CO-RE: "multi" where one link holds a file's points

    def record(self, reason: str) -> dict[str, object]:
        """Which loader ran, its version and why it was chosen (ebpf.json and the manifest)."""
        found = loader_record(self.name, reason)
        if self.name == "core":
            # How the region probes were linked: every point of a program in a file by one link
            # ("multi"), or a link a point.
            found["uprobe_links"] = self.uprobe_links
        return found

    def detach(self) -> None:
        """Every probe off, the maps still readable: CO-RE's links close on a thread of their
        own, so that the kernel's waits overlap the reading (bcc's go at close())."""
        if isinstance(self.program, CoreObject):
            self.program.detach(wait=False)

    def close(self, wait: bool = False) -> None:
        """Every probe detached and the program freed; safe to call more than once."""
        if isinstance(self.program, CoreObject):
            self.program.close(wait=wait)
            return
        with contextlib.suppress(Exception):
            detach_uprobes(self.program)
        with contextlib.suppress(Exception):
            self.program.cleanup()


def loader_record(name: LoaderName, reason: str) -> dict[str, object]:
    """A loader's name, version and why it ran; also the record of a capture that loaded
    nothing (no runtime, walker or tracepoint)."""
    if name == "core":
        version = libbpf.version()
        return {"name": "core", "version": f"libbpf {version}", "libbpf": version, "reason": reason}
    return {"name": "bcc", "version": f"bcc {bcc_version()}", "reason": reason}


def load(
    name: LoaderName, request: LoadRequest, found: Sequence[Future[RuntimeProbes | None]]
) -> Loaded | None:
    """The program through the named loader; None where there is nothing to load. On any
    failure nothing stays attached."""
    loader: Callable[[LoadRequest, Sequence[Future[RuntimeProbes | None]]], Loaded | None]
    loader = _load_core if name == "core" else _load_bcc
    return loader(request, found)


def _walker_on(request: LoadRequest) -> bool:
    return request.walker is not None and request.walker.layout is not None


def _load_core(
    request: LoadRequest, found: Sequence[Future[RuntimeProbes | None]]
) -> Loaded | None:
    walker = _walker_on(request)
    if not (request.runtimes or walker or request.sched):
        return None
    layout = request.walker.layout if walker and request.walker is not None else None
    if request.logs:
        program = OpenMPProgram(request.runtimes, request.pid, native_stacks=request.native_stacks)
        core = load_process(
            request.pid,
            layout,
            program.sample_capacity,
            program.region_capacity,
            SchedProgram(request.pid).slice_capacity if request.sched else 1,
            program.native_stacks,
        )
    else:
        # Counters only (profkit watch): a program only where there are regions to count.
        probes = [p for p in (f.result() for f in found) if p is not None]
        if not probes:
            return None
        core = load_process(request.pid, layout, 1, 1, 1, 0)  # logs of one entry: off
    loaded = Loaded(
        "core",
        core,
        CoreRegionProbes(core, request.pid),
        [],
        uprobe_links="multi" if core.multi_uprobes else "single",
    )
    try:
        loaded.probes = [p for p in (f.result() for f in found) if p is not None]
        if request.sched:
            seed_threads(core, request.pid)
            for program_name, event in SCHED_PROGRAMS.items():
                core.attach(program_name)
                loaded.attached.append(f"tp_btf:sched:{event}")
            loaded.sched = True
        if walker and request.walker is not None:
            if request.sample_hz:
                core.attach_cpu_clock(SAMPLER, request.sample_hz)
                loaded.attached.append(_sampler_line(request))
                if request.sched:
                    # Who wakes the pool's workers, for their samples: on every wakeup of the
                    # machine, so only where the scheduler's tracepoints fit the budget.
                    core.attach("on_waking")
                    loaded.attached.append("tp_btf:sched:sched_waking (dispatchers)")
                loaded.sampling = True
            request.walker.attach(core)
    except Exception:
        _halt(request)
        core.close(wait=True)
        raise
    return loaded


def _load_bcc(request: LoadRequest, found: Sequence[Future[RuntimeProbes | None]]) -> Loaded | None:
    flags = list(request.walker_flags)
    sched = request.sched and request.logs
    program = OpenMPProgram(
        request.runtimes,
        request.pid,
        region_capacity=OpenMPProgram.region_capacity if request.logs else 1,
        sample_capacity=OpenMPProgram.sample_capacity if request.logs else 1,
        sched=SchedProgram(request.pid) if sched else None,
        native_stacks=request.native_stacks if request.native else 0,
        dispatch_wakeups=sched,
    )
    if request.print_source:
        print(f"/* --- process ({' '.join(flags)}) --- */\n{program.source()}")
    if not (program.runtimes or flags or program.sched):
        return None
    bcc = load_bcc()
    # The compile is a ctypes call, outside the GIL: the probe points are found meanwhile.
    bpf = bcc.BPF(text=program.source(), cflags=flags)
    loaded = Loaded("bcc", bpf, BccRegionProbes(bpf, request.pid), [])
    try:
        loaded.probes = [p for p in (f.result() for f in found) if p is not None]
        if program.sched is not None:
            # TRACEPOINT_PROBE functions are attached as the program loads.
            seed_threads(bpf, request.pid)
            loaded.attached += [
                "tracepoint:sched:sched_switch",
                "tracepoint:sched:sched_wakeup",
                "tracepoint:sched:sched_wakeup_new",
            ]
            loaded.sched = True
        if flags:
            if request.sample_hz:
                bpf.attach_perf_event(
                    ev_type=bcc.PerfType.SOFTWARE,
                    ev_config=bcc.PerfSWConfig.CPU_CLOCK,
                    fn_name=SAMPLER,
                    sample_freq=request.sample_hz,
                )
                loaded.sampling = True
                loaded.attached.append(_sampler_line(request))
                if program.dispatch_wakeups:
                    # Attached as the program loaded: who wakes the pool's workers.
                    loaded.attached.append("tracepoint:sched:sched_waking (dispatchers)")
            assert request.walker is not None
            request.walker.attach(bpf)
    except Exception:
        _halt(request)
        loaded.close()
        raise
    return loaded


def _halt(request: LoadRequest) -> None:
    """The walker's thread stopped, where it began to feed a program that is going."""
    if request.walker is not None:
        with contextlib.suppress(Exception):
            request.walker.halt()


def _sampler_line(request: LoadRequest) -> str:
    what = "Python and native stacks" if request.native else "Python stacks"
    return f"perf_event:cpu-clock@{request.sample_hz}Hz ({what})"


def seed_threads(program: BpfProgram | CoreObject, pid: int) -> None:
    """The target's threads as they are, so that the scheduler's times start from them; as
    many as the map holds (a target's thread count is its own to choose)."""
    times = program["times"]
    for tid in procfs.list_tids(pid):
        try:
            times[times.Key(tid)] = times.Leaf()
        except Exception:  # full (E2BIG; bcc raises a bare Exception): the rest start unseen
            return
