"""The one small interface every collector implements. What it reports when it stops is part
of the bundle (bundle/parts.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from ...bundle.parts import CollectorResult
from ...host.target import Target
from ..budget import Budget, PySpyMode
from ..clock import Clock

PythonStacks = Literal["auto", "off"]
EbpfSched = Literal["auto", "on", "off"]
# How the eBPF programs load: bcc compiles them on the node (headers and a compiler there),
# or the prebuilt CO-RE object loads through profkit's own loader (BTF is enough); auto takes CO-RE
# wherever it loads.
EbpfLoader = Literal["auto", "core", "bcc"]
PerfCallgraph = Literal["fp", "dwarf"]


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class CaptureOptions:
    """How the collectors are to run, as the command asked and the plan decided."""

    budget: Budget = field(default_factory=Budget)
    pyspy_mode: PySpyMode = "native"  # the plan decides what the command's "auto" means
    pyspy_mode_reason: str = ""  # why the plan chose --nonblocking
    # Where it chose --nonblocking and no eBPF probe runs, so nothing has native frames or
    # regions to place the pool: the --budget at which --native would (budget.native_budget).
    pyspy_native_budget: float | None = None
    python_stacks: PythonStacks = "auto"  # "off": no eBPF stack walker
    ebpf_sched: EbpfSched = "auto"
    ebpf_loader: EbpfLoader = "auto"
    perf_callgraph: PerfCallgraph = "fp"
    perf_rate_hz: int = 49
    perf_scope: str = "cpu"  # "thread"
    perf_max_mb: int = 64  # perf record's own bound on perf.data


@dataclass(frozen=True)
class CaptureContext:
    target: Target
    directory: Path  # the bundle directory; each collector writes its own files there
    rate_hz: int
    duration_s: float
    clock: Clock
    options: CaptureOptions = field(default_factory=CaptureOptions)
    # Every child tool's pid is recorded, so that a later run can clean up after a killed one.
    register_child: Callable[[int], None] = lambda pid: None
    # The capture's collector set: a collector's part of the budget depends on who else runs.
    collectors: tuple[str, ...] = ()


@runtime_checkable
class Collector(Protocol):
    name: str

    def available(self, target: Target) -> Availability: ...

    def start(self, context: CaptureContext) -> None: ...

    def stop(self) -> CollectorResult: ...

    def progress(self) -> int:
        """Samples so far, for the live display."""
        ...
