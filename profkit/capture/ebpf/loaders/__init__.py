"""The process program loaded for one target, through either loader, behind one interface.

- core (loaders/core.py): the prebuilt CO-RE object, nothing compiled on the node; the kernel's
  BTF relocates the few kernel fields it reads. Wherever the kernel has BTF.
- bcc (loaders/bcc.py): text made from the same source (loaders/bcc_source.py), compiled by bcc
  against the kernel's headers; for kernels without BTF.

A request says what the program is to hold; the loader returns a Program, which attaches and
detaches its parts, reads its maps by name, reports its programs' run time, and closes itself.
Nobody asks which loader ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ....host.pyruntime import Layout
from ..placement.regions import Uprobe
from ..program import Capacities

LoaderName = Literal["core", "bcc"]


@dataclass(frozen=True)
class LoadRequest:
    """What one target's program is to hold."""

    pid: int
    layout: Layout | None  # the interpreter's, for the walker; None: no Python stacks
    capacities: Capacities
    runtimes: int  # runtime copies whose regions are probed (bcc compiles an entry each)
    entry_cookies: tuple[int, ...] = ()  # one per copy: bcc compiles it into on_entry_N
    sched: bool = False  # the scheduler's tracepoints may be attached (bcc compiles them in)
    cost_parts: int = 0  # benchmarks/region_cost.py's parts (program.py's COST_*)
    print_source: bool = False  # bcc's text printed before it compiles (--print-programs)


class Program(Protocol):
    """One loaded process program of one target."""

    name: LoaderName

    def __getitem__(self, map_name: str) -> Any:
        """A map, read and written as bcc's tables are (item access, items(), len)."""

    def attach_sampler(self, frequency_hz: int) -> None:
        """The on-CPU sampler on a cpu-clock event on every CPU."""

    def attach_sched(self, waking: bool) -> list[str]:
        """The scheduler's tracepoints (and, with waking, who wakes the pool's workers); what
        was attached, as the capture lists it."""

    def detach_sched(self) -> None: ...

    def attach_regions(self, probes: Sequence[Uprobe]) -> None:
        """Attach all of them, or, when one fails, none (and raise)."""

    def detach_regions(self, entries: bool) -> None:
        """Detach every attached entry probe (True) or end probe (False) at once."""

    def attach_calibration(self, path: str, address: int, file_offset: int) -> object:
        """The empty program on one instruction of a file mapped by profkit itself (its
        virtual address in the file, and its offset): a handle for detach_calibration."""

    def detach_calibration(self, handle: object) -> None: ...

    def run_stats(self, programs: Sequence[str]) -> tuple[int, int]:
        """(runs, nanoseconds inside) of these programs together, as the kernel counts while
        BPF statistics are on; (0, 0) where it does not say."""

    def entry_programs(self) -> list[str]:
        """The region entry programs' names (CO-RE: one; bcc: one a runtime copy)."""

    def record(self, reason: str) -> dict[str, object]:
        """Which loader ran, its version and why (ebpf.json's and the manifest's loader)."""

    def detach(self) -> None:
        """Every probe off, the maps still readable."""

    def close(self, wait: bool = False) -> None:
        """Every probe detached and the program freed; safe to call more than once."""


def load(name: LoaderName, request: LoadRequest) -> Program:
    """The program through the named loader, nothing attached. Raises the loader's error
    (LoaderUnavailable) where it cannot load here."""
    if name == "core":
        from .core import load_core

        return load_core(request)
    from .bcc import load_bcc_program

    return load_bcc_program(request)


class LoaderUnavailable(RuntimeError):
    """The loader cannot load the program here; the message says why and what would."""
