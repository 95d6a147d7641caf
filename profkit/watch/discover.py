"""Which processes are targets now: pid, command line (as `ps --match`) or cgroup selectors.

A process is known by its pid, start time and where its last exec put its arguments, so that a
reused pid, and a process that exec'd another program, are new targets.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..host import procfs
from ..host.cgroup import parse_proc_cgroup
from .options import Selectors

Identity = tuple[int, int, int]  # pid, start ticks, arg_start (procfs.ProcessImage)


@dataclass(frozen=True)
class Candidate:
    pid: int
    start_ticks: int
    cmdline: tuple[str, ...]
    comm: str
    arg_start: int = 0

    @property
    def identity(self) -> Identity:
        return (self.pid, self.start_ticks, self.arg_start)


def _cgroup_paths(pid: int) -> set[str]:
    try:
        return set(parse_proc_cgroup(Path(f"/proc/{pid}/cgroup").read_text()).values())
    except OSError:
        return set()


def _under(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix.rstrip("/") + "/")


def candidates(selectors: Selectors, own: int | None = None) -> list[Candidate]:
    """Live processes the selectors name (not yet checked for Python: see target.inspect)."""
    own = own or os.getpid()
    patterns = [re.compile(m) for m in selectors.matches]
    wanted_pids = set(selectors.pids)
    scan = bool(patterns or selectors.cgroups)
    pids = [int(e) for e in os.listdir("/proc") if e.isdigit()] if scan else sorted(wanted_pids)
    found = []
    for pid in pids:
        if pid == own:
            continue
        try:
            cmdline = procfs.read_cmdline(pid)
            if not cmdline:
                continue  # kernel threads and zombies
            chosen = pid in wanted_pids
            if not chosen and patterns:
                command = " ".join(cmdline)
                chosen = any(p.search(command) for p in patterns)
            if not chosen and selectors.cgroups:
                paths = _cgroup_paths(pid)
                chosen = any(_under(p, c) for p in paths for c in selectors.cgroups)
            if not chosen:
                continue
            stat = procfs.read_stat(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if stat.state == "Z":
            continue
        found.append(Candidate(pid, stat.start_ticks, cmdline, stat.comm, stat.arg_start))
    return found
