"""What a capture will do, decided before anything starts: the collectors this user may run,
py-spy's mode and rate within the budget, and what to tell the user about both.

Plain functions over the target and the options asked for, so that `attach` and `run` only
parse their options, print the notes and call capture().
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..errors import PermissionDenied, UsageError
from ..host.cgroup import CgroupError, cpu_cgroup
from ..host.target import Target
from .budget import auto_mode, default_rate, native_budget, pyspy_stop_part
from .collectors.base import CaptureOptions
from .ebpf.collector import EbpfCollector
from .ebpf.pywalk import PythonWalker
from .registry import ALL_COLLECTORS, REGISTRY
from .unprivileged import cannot_run

# perf stat repeats what /proc and eBPF already count, at a cost (docs/collectors.md): opt-in.
# The eBPF walker's sampler takes the native stacks too; perf record joins the default set
# where the walker cannot run or DWARF call graphs are asked for, and py-spy only where the
# walker cannot read the target's Python stacks (plan_collectors).
DEFAULT_COLLECTORS = ("ebpf", "proc", "cgroup")
FALLBACK_COLLECTORS = (*DEFAULT_COLLECTORS, "perf_record", "pyspy")


@dataclass(frozen=True)
class CapturePlan:
    collectors: tuple[str, ...]  # asked for, as the manifest records them
    unavailable: dict[str, str]  # of those, the ones this user may not run and why: not started
    rate_hz: int  # py-spy's
    options: CaptureOptions  # with py-spy's mode decided
    notes: tuple[str, ...]  # for the user, before the capture starts


def plan_capture(
    target: Target, collectors: str | None, rate_hz: int | None, options: CaptureOptions
) -> CapturePlan:
    """collectors: the --collectors list (None: the defaults); rate_hz None: chosen to fit the
    budget; options.pyspy_mode may be "auto"."""
    root = os.geteuid() == 0
    ebpf_denied = None if root else cannot_run(("ebpf",), options.perf_scope).get("ebpf")
    asked, pyspy_note = plan_collectors(
        collectors, target, options.python_stacks, ebpf_denied, options.perf_callgraph
    )
    unavailable = {} if root else cannot_run(asked, options.perf_scope)
    if unavailable and not set(asked) - set(unavailable):
        raise PermissionDenied(
            f"none of the collectors asked for can run as uid {os.geteuid()}: "
            + "; ".join(f"{name}: {why}" for name, why in unavailable.items())
        )
    notes = [f"note: {name} not started: {why}" for name, why in unavailable.items()]
    if pyspy_note:
        notes.append(f"note: {pyspy_note}")
    runnable = tuple(n for n in asked if n not in unavailable)
    if not target.has_torch:
        notes.append(f"note: pid {target.pid} has no torch loaded; capturing anyway")
    probes = "ebpf" in runnable and EbpfCollector().available(target).ok
    options, rate_hz = plan_pyspy(target, options, rate_hz, probes)
    if options.pyspy_mode_reason and "pyspy" in runnable:
        notes.append(f"py-spy goes --nonblocking: {options.pyspy_mode_reason}")
        if options.pyspy_native_budget is not None:
            notes.append(
                "note: without eBPF or native frames the pool gets no call site: "
                f"`profkit attach --pid {target.pid} --pyspy-mode native --budget "
                f"{100 * options.pyspy_native_budget:g}` would give one"
            )
    return CapturePlan((*runnable, *unavailable), unavailable, rate_hz, options, tuple(notes))


def plan_pyspy(
    target: Target, options: CaptureOptions, rate_hz: int | None, probes: bool
) -> tuple[CaptureOptions, int]:
    """py-spy's mode (where "auto") and rate (where not given), from the part of the budget its
    stops may take, larger without the eBPF region probes (probes)."""
    cpus = usable_cpus(target.pid)
    budget = options.budget.fraction
    stop_part = pyspy_stop_part(probes)
    if options.pyspy_mode == "auto":
        mode, reason = auto_mode(target.threads, budget, cpus, stop_part)
        needed = native_budget(target.threads, cpus) if mode != "native" and not probes else None
        options = replace(
            options, pyspy_mode=mode, pyspy_mode_reason=reason, pyspy_native_budget=needed
        )
    if rate_hz is None:
        rate_hz = default_rate(target.threads, budget, options.pyspy_mode, cpus, stop_part)
    return options, rate_hz


def usable_cpus(pid: int) -> float:
    """How many of the target's threads can run at once: its CPU affinity, capped by a quota."""
    try:
        cpus: float = len(os.sched_getaffinity(pid))
    except OSError:
        cpus = float(os.cpu_count() or 1)
    try:
        quota = cpu_cgroup(pid).effective_cores
    except CgroupError:
        quota = None
    return cpus if quota is None else min(cpus, quota)


def plan_collectors(
    text: str | None,
    target: Target,
    python_stacks: str = "auto",
    ebpf_denied: str | None = None,
    perf_callgraph: str = "fp",
) -> tuple[tuple[str, ...], str]:
    """The collectors to run, and why py-spy was added to the default set ("" if it was not).
    Asked-for collectors are run as asked; ebpf_denied is why this user may not load BPF."""
    if text is not None:
        return parse_collectors(text), ""
    availability = EbpfCollector().available(target)
    if ebpf_denied:
        why = f"eBPF is not allowed ({ebpf_denied})"
    elif not availability.ok:
        why = f"eBPF is unavailable ({availability.reason})"
    elif python_stacks == "off":
        why = "the eBPF stack walker is off (--python-stacks off)"
    else:
        walker = PythonWalker(target.pid)
        if walker.prepare():
            if perf_callgraph != "fp":
                return (*DEFAULT_COLLECTORS, "perf_record"), ""
            return DEFAULT_COLLECTORS, ""
        why = walker.reason.replace(
            "Python stack walker off: ", "the eBPF stack walker cannot run: "
        )
    return FALLBACK_COLLECTORS, f"py-spy samples the Python stacks, perf the native: {why}"


def parse_collectors(text: str | None) -> tuple[str, ...]:
    """None: the defaults; an empty or blank list is an error, not a silent default."""
    if text is None:
        return DEFAULT_COLLECTORS
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if names == ("all",):
        return ALL_COLLECTORS
    if not names:
        raise UsageError(f"no collector named; known: {', '.join(ALL_COLLECTORS)} (or all)")
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise UsageError(
            f"unknown collector {', '.join(unknown)}; known: {', '.join(ALL_COLLECTORS)} (or all)"
        )
    return tuple(n for n in ALL_COLLECTORS if n in names)
