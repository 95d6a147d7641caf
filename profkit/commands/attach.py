"""`profkit attach`: capture a live process with every collector into a session bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..bundle.write import default_directory
from ..capture.budget import Budget
from ..capture.collectors.base import (
    CaptureOptions,
    EbpfLoader,
    EbpfSched,
    PerfCallgraph,
    PySpyMode,
    PythonStacks,
)
from ..capture.plan import plan_capture
from ..capture.runs import clean_stale
from ..capture.session import CaptureRequest, capture
from ..errors import EXIT_INTERRUPTED, EXIT_OK, UsageError
from ..host.target import Target, inspect
from .options import capture_options, pid_option
from .output import import_report_meanwhile, print_outcome, progress_printer


def run_capture(
    target: Target,
    *,
    duration: float,
    out: str | None,
    rate: int | None,
    collectors: str | None,
    max_size_mb: float,
    perf_callgraph: PerfCallgraph,
    perf_rate: int,
    no_report: bool,
    perf_scope: str = "cpu",
    budget_pct: float = 100 * Budget().fraction,
    tool_cores: float = Budget().tool_cores,
    pyspy_mode: PySpyMode = "auto",
    ebpf_sched: EbpfSched = "auto",
    ebpf_loader: EbpfLoader = "auto",
    python_stacks: PythonStacks = "auto",
    force: bool = False,
) -> int:
    """The capture options as capture_options names them; the exit code."""
    if duration <= 0:
        raise UsageError(f"--duration must be positive, got {duration:g}")
    if max_size_mb <= 0:
        raise UsageError(f"--max-size must be positive, got {max_size_mb:g}")
    if budget_pct <= 0 or tool_cores <= 0:
        raise UsageError("--budget and --cpu-budget must be positive")
    for cleanup in clean_stale():
        click.echo(
            f"profkit: a capture by pid {cleanup.owner} was killed; cleaned up: "
            f"{'; '.join(cleanup.actions) or 'nothing was left'}",
            err=True,
        )
    options = CaptureOptions(
        budget=Budget(fraction=budget_pct / 100, tool_cores=tool_cores),
        pyspy_mode=pyspy_mode,
        python_stacks=python_stacks,
        ebpf_sched=ebpf_sched,
        ebpf_loader=ebpf_loader,
        perf_callgraph=perf_callgraph,
        perf_rate_hz=perf_rate,
        perf_scope=perf_scope,
    )
    plan = plan_capture(target, collectors, rate, options)
    for note in plan.notes:
        click.echo(f"profkit: {note}", err=True)
    request = CaptureRequest(
        target=target,
        directory=Path(out) if out else default_directory(target.pid),
        duration_s=duration,
        rate_hz=plan.rate_hz,
        collectors=plan.collectors,
        max_size_mb=max_size_mb,
        options=plan.options,
        force=force,
        unavailable=plan.unavailable,
    )
    if not no_report:
        import_report_meanwhile()
    manifest = capture(request, on_tick=progress_printer())
    for other in manifest.get("overlapped_with", []):
        click.echo(
            f"profkit: note: profkit pid {other['pid']} captured pid {target.pid} at the same "
            f"time (into {other['bundle']}): the target paid for both",
            err=True,
        )
    print_outcome(request.directory, manifest, report=not no_report)
    return EXIT_INTERRUPTED if manifest["status"] == "partial" else EXIT_OK


@click.command()
@pid_option
@capture_options
def attach(pid: int, **options: Any) -> int:
    """Attach to a live process, capture, save a bundle and print the verdict."""
    return run_capture(inspect(pid), **options)
