"""`profkit attach`: capture a live process with every collector into a session bundle."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..bundle.write import default_directory
from ..capture.budget import Budget, auto_mode, default_rate, pyspy_stop_share
from ..capture.collectors.base import CaptureOptions
from ..capture.ebpf.collector import EbpfCollector
from ..capture.runs import clean_stale
from ..capture.session import CaptureRequest, capture, plan_collectors, progress_printer
from ..capture.unprivileged import cannot_run
from ..errors import EXIT_INTERRUPTED, EXIT_OK, PermissionDenied, UsageError
from ..host.cgroup import CgroupError, cpu_cgroup
from ..host.target import Target, inspect
from .options import capture_options, pid_option
from .output import print_outcome


def run_capture(
    target: Target,
    duration: float,
    out: str | None,
    rate: int | None,
    collectors: str | None,
    max_size_mb: float,
    perf_callgraph: str,
    perf_rate: int,
    no_report: bool,
    perf_scope: str = "cpu",
    budget_pct: float = 100 * Budget().overhead_share,
    tool_cores: float = Budget().tool_cores,
    pyspy_mode: str = "auto",
    ebpf_sched: str = "auto",
    python_stacks: str = "auto",
    force: bool = False,
) -> int:
    if duration <= 0:
        raise UsageError(f"--duration must be positive, got {duration:g}")
    if max_size_mb <= 0:
        raise UsageError(f"--max-size must be positive, got {max_size_mb:g}")
    if budget_pct <= 0 or tool_cores <= 0:
        raise UsageError("--budget and --cpu-budget must be positive")
    budget = Budget(overhead_share=budget_pct / 100, tool_cores=tool_cores)
    ebpf_denied = cannot_run(("ebpf",), perf_scope).get("ebpf") if os.geteuid() != 0 else None
    parsed, pyspy_note = plan_collectors(collectors, target, python_stacks, ebpf_denied)
    for cleanup in clean_stale():
        click.echo(
            f"profkit: a capture by pid {cleanup.owner} was killed; cleaned up: "
            f"{'; '.join(cleanup.actions) or 'nothing was left'}",
            err=True,
        )
    unavailable = cannot_run(parsed, perf_scope) if os.geteuid() != 0 else {}
    if unavailable and not set(parsed) - set(unavailable):
        raise PermissionDenied(
            f"none of the collectors asked for can run as uid {os.geteuid()}: "
            + "; ".join(f"{name}: {why}" for name, why in unavailable.items())
        )
    for name, why in unavailable.items():
        click.echo(f"profkit: note: {name} not started: {why}", err=True)
    if pyspy_note:
        click.echo(f"profkit: note: {pyspy_note}", err=True)
    parsed = tuple(n for n in parsed if n not in unavailable)
    if not target.has_torch:
        click.echo(
            f"profkit: note: pid {target.pid} has no torch loaded; capturing anyway", err=True
        )
    cpus = usable_cpus(target.pid)
    stop_share = pyspy_stop_share(probes="ebpf" in parsed and EbpfCollector().available(target).ok)
    mode_reason = ""
    if pyspy_mode == "auto":
        pyspy_mode, mode_reason = auto_mode(target.threads, budget.overhead_share, cpus, stop_share)
        if mode_reason:
            click.echo(f"profkit: py-spy goes --nonblocking: {mode_reason}", err=True)
    request = CaptureRequest(
        target=target,
        directory=Path(out) if out else default_directory(target.pid),
        duration_s=duration,
        rate_hz=rate
        if rate is not None
        else default_rate(target.threads, budget.overhead_share, pyspy_mode, cpus, stop_share),
        collectors=(*parsed, *unavailable),
        max_size_mb=max_size_mb,
        options=CaptureOptions(
            budget=budget,
            pyspy_mode=pyspy_mode,
            pyspy_mode_reason=mode_reason,
            python_stacks=python_stacks,
            ebpf_sched=ebpf_sched,
            perf_callgraph=perf_callgraph,
            perf_rate_hz=perf_rate,
            perf_scope=perf_scope,
        ),
        force=force,
        unavailable=unavailable,
    )
    manifest = capture(request, on_tick=progress_printer())
    for other in manifest.get("overlapped_with", []):
        click.echo(
            f"profkit: note: profkit pid {other['pid']} captured pid {target.pid} at the same "
            f"time (into {other['bundle']}): the target paid for both",
            err=True,
        )
    print_outcome(request.directory, manifest, report=not no_report)
    return EXIT_INTERRUPTED if manifest["status"] == "partial" else EXIT_OK


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


@click.command()
@pid_option
@capture_options
def attach(pid: int, **options: object) -> int:
    """Attach to a live process, capture, save a bundle and print the verdict."""
    return run_capture(inspect(pid), **options)  # type: ignore[arg-type]
