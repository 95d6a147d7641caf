"""The region probes of one loaded process program, attached and detached in two groups (the
entries, the ends) whichever loader loaded it: the duty cycle and the rate check switch them
through this interface alone.

bcc attaches a compiled handler per runtime copy by the file's address; libbpf attaches the
prebuilt object's one entry program by file offset, with the copy and the team size's register
in the attachment's cookie.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol

from .core_program import entry_cookie
from .libbpf import CoreObject, Link
from .loader import BpfProgram, detach_uprobes
from .regions import Uprobe, handler_name
from .returns import file_offset, symbol_address

END_PROGRAM = "on_region_return"


class RegionProbes(Protocol):
    def attach(self, probes: Sequence[Uprobe]) -> None:
        """Attach all of them, or, when one fails, none (and raise)."""

    def detach(self, entries: bool) -> None:
        """Detach every attached entry probe (True) or end probe (False) at once."""


class BccRegionProbes:
    def __init__(self, bpf: BpfProgram, pid: int) -> None:
        self._bpf, self._pid = bpf, pid
        self._events: dict[bool, set[bytes]] = {True: set(), False: set()}

    def attach(self, probes: Sequence[Uprobe]) -> None:
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
                handler = handler_name(probe.runtime) if probe.entry else END_PROGRAM
                getattr(self._bpf, f"attach_{kind}")(fn_name=handler, **where)
                added[probe.entry] |= set(self._bpf.uprobe_fds) - before
        except Exception:
            with contextlib.suppress(Exception):
                detach_uprobes(self._bpf, added[True] | added[False])
            raise
        for entry, events in added.items():
            self._events[entry] |= events

    def detach(self, entries: bool) -> None:
        events, self._events[entries] = self._events[entries], set()
        if events:
            detach_uprobes(self._bpf, events)


class CoreRegionProbes:
    def __init__(self, core: CoreObject, pid: int) -> None:
        self._core, self._pid = core, pid
        self._links: dict[bool, list[Link]] = {True: [], False: []}

    def attach(self, probes: Sequence[Uprobe]) -> None:
        # One link for every point of a program in a file, where the kernel has multi-uprobe
        # links: a link's close waits for the kernel's grace period once, whatever it holds.
        groups: dict[tuple[bool, str, str, bool], list[tuple[int, int]]] = {}
        for probe in probes:
            path = probe.target_path()
            address = probe.address
            if address is None:
                address = symbol_address(path, probe.symbol)
                if address is None:
                    raise LookupError(f"{probe.symbol} is not in {probe.path}")
            program = "on_region_entry" if probe.entry else END_PROGRAM
            cookie = entry_cookie(probe.runtime, probe.requested_arg) if probe.entry else 0
            groups.setdefault((probe.entry, program, path, probe.retprobe), []).append(
                (file_offset(path, address), cookie)
            )
        added: dict[bool, list[Link]] = {True: [], False: []}
        try:
            for (entry, program, path, retprobe), points in groups.items():
                added[entry] += self._core.attach_uprobes(
                    program, path, points, self._pid, retprobe=retprobe
                )
        except Exception:
            self._core.destroy(added[True] + added[False])
            raise
        for entry, links in added.items():
            self._links[entry] += links

    def detach(self, entries: bool) -> None:
        # The probes stop as the closes begin; the kernel's waits after that need not hold up
        # the window (libbpf.CoreObject.destroy).
        links, self._links[entries] = self._links[entries], []
        self._core.destroy(links, wait=False)
