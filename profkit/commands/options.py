"""Options shared by several subcommands, declared once."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..bundle.write import check_output
from ..capture.budget import (
    HANG_S,
    MAX_DEFAULT_RATE_HZ,
    PYSPY_CPU_PART,
    PYSPY_STOP_PART,
    SCHED_TRACE_PART,
    STOP_LIMIT,
    Budget,
    pyspy_stop_part,
    times,
)
from ..capture.plan import DEFAULT_COLLECTORS, parse_collectors
from ..capture.registry import ALL_COLLECTORS
from ..errors import UsageError


class Number(click.ParamType):
    """A finite int or float inside [low, high] (low excluded when low_open): nan and inf are
    refused here, before any target is inspected or tool started."""

    def __init__(
        self,
        kind: type[int] | type[float],
        low: float,
        high: float,
        low_open: bool = False,
        unit: str = "",
    ) -> None:
        self.kind, self.low, self.high, self.low_open, self.unit = kind, low, high, low_open, unit
        self.name = kind.__name__

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        number: float
        if isinstance(value, self.kind) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = self.kind(str(value).strip())
            except ValueError:
                article = "an" if self.kind is int else "a"
                self.fail(f"{value!r} is not {article} {self.name}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value} is not a finite number", param, ctx)
        too_low = number <= self.low if self.low_open else number < self.low
        if too_low or number > self.high:
            low = f"more than {self.low:g}" if self.low_open else f"at least {self.low:g}"
            self.fail(
                f"{value} is out of range: {low} and at most {self.high:g}{self.unit}", param, ctx
            )
        return number


class FileMode(click.ParamType):
    """An octal permission mode such as 600 or 0644."""

    name = "mode"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        try:
            mode = int(str(value), 8)
        except ValueError:
            self.fail(f"{value!r} is not an octal mode such as 600 or 644", param, ctx)
        if not 0 <= mode <= 0o777:
            self.fail(f"{value} is out of range: 000 to 777", param, ctx)
        return mode


# Reports and exports hold the target's command lines and stacks: owner-only unless asked.
mode_option = click.option(
    "--mode",
    "mode",
    type=FileMode(),
    default="600",
    show_default=True,
    help="Permissions of the file written (octal).",
)


def collectors_callback(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    """Checked at parse time, so that `run` never starts its command for a bad list."""
    if value is None:
        return None
    try:
        parse_collectors(value)
    except UsageError as exc:
        raise click.BadParameter(exc.format_message(), ctx, param) from exc
    return value


def out_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A link or another user's directory is refused before the target is touched."""
    if value is not None:
        check_output(Path(value))
    return value


F = TypeVar("F", bound=Callable[..., Any])


def pct(share: float) -> str:
    return f"{100 * share:g}%"


pid_option = click.option("--pid", "-p", type=int, required=True, help="Target process id.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")


def capture_options(function: F) -> F:
    """Options shared by `attach` and `run`."""
    decorators = [
        click.option(
            "--duration",
            "-d",
            type=Number(float, 0, 86400, low_open=True, unit=" s"),
            default=10.0,
            show_default=True,
            help="Seconds to capture.",
        ),
        click.option(
            "--out",
            "-o",
            "out",
            type=click.Path(file_okay=False),
            callback=out_callback,
            help="Bundle directory (default: profkit-sessions/PID-TIME).",
        ),
        click.option(
            "--rate",
            "-r",
            type=Number(int, 1, 1000, unit=" Hz"),
            default=None,
            help=f"py-spy sampling rate in Hz (default: up to {MAX_DEFAULT_RATE_HZ}, chosen from "
            "the target's thread and CPU counts so that py-spy's pauses and its own CPU fit "
            f"their parts of --budget: {pct(PYSPY_STOP_PART)} and {pct(PYSPY_CPU_PART)}, the "
            f"pauses {pct(pyspy_stop_part(probes=False))} where no eBPF probe runs).",
        ),
        click.option(
            "--pyspy-mode",
            type=click.Choice(["auto", "native", "nonblocking"]),
            default="auto",
            show_default=True,
            help="native: native frames, the target stopped per sample (needed to tell call "
            "sites apart reliably); nonblocking: never stopped, sites placed by time only; "
            "auto: native unless even 1 Hz of it would exceed the pauses' part of --budget.",
        ),
        click.option(
            "--budget",
            "--stop-budget",
            "budget_pct",
            type=Number(float, 0, 100, low_open=True, unit="%"),
            default=100 * Budget().fraction,
            show_default=True,
            help="Most % of the target's throughput profkit may cost it: sets py-spy's rate "
            "and mode, whether the scheduler is traced and whether the OpenMP region probes "
            "stay on, are switched on and off or come off, each held to its part (without "
            "py-spy, the default with the eBPF walker, the capture aims at 0.3-0.5 of it); if the "
            f"target is seen stopped more than {times(STOP_LIMIT)} this share of its time (95% "
            f"confidence) or for {HANG_S:g} s at once, py-spy goes --nonblocking.",
        ),
        click.option(
            "--ebpf-sched",
            type=click.Choice(["auto", "on", "off"]),
            default="auto",
            show_default=True,
            help="Scheduler tracepoints (slices, wakeups): auto traces them unless the machine's "
            "context-switch rate says they would cost more than their part "
            f"({pct(SCHED_TRACE_PART)}) of --budget.",
        ),
        click.option(
            "--ebpf-loader",
            type=click.Choice(["auto", "core", "bcc"]),
            default="auto",
            show_default=True,
            help="How the eBPF programs load: core loads the prebuilt CO-RE object through "
            "profkit's own loader (needs only a kernel with BTF), bcc compiles them here (needs "
            "kernel headers and bcc); both hold every program. auto takes core wherever it "
            "loads, else bcc.",
        ),
        click.option(
            "--python-stacks",
            type=click.Choice(["auto", "off"]),
            default="auto",
            show_default=True,
            help="auto: the eBPF walker reads each parallel region's Python stack and samples "
            "the Python threads on CPU, without stopping them (CPython 3.10-3.15, not "
            "free-threaded); where it cannot, py-spy joins the default collectors. off: no walker.",
        ),
        click.option(
            "--cpu-budget",
            "tool_cores",
            type=Number(float, 0, 4096, low_open=True, unit=" cores"),
            default=Budget().tool_cores,
            show_default=True,
            help="Most CPU (cores) profkit and its tools may use; over it a collector stops.",
        ),
        click.option(
            "--collectors",
            "-c",
            callback=collectors_callback,
            help=f"Comma-separated subset of {', '.join(ALL_COLLECTORS)}, or all (default: "
            f"{', '.join(DEFAULT_COLLECTORS)}; perf_record with --perf-callgraph dwarf; "
            "perf_record and pyspy where the eBPF walker cannot read the target's stacks).",
        ),
        click.option(
            "--max-size",
            "max_size_mb",
            type=Number(float, 0, 1024 * 1024, low_open=True, unit=" MB"),
            default=256.0,
            show_default=True,
            help="Bundle size bound in MB.",
        ),
        click.option(
            "--perf-callgraph",
            type=click.Choice(["fp", "dwarf"]),
            default="fp",
            show_default=True,
            help="native stack unwinding: fp (frame pointers, by the eBPF sampler or perf) or "
            "dwarf (perf record only: whole stacks, ~100x data).",
        ),
        click.option(
            "--perf-rate",
            type=Number(int, 1, 100000, unit=" Hz"),
            default=49,
            show_default=True,
            help="native stacks' cpu-clock sampling rate in Hz (the eBPF sampler's, or perf "
            "record's).",
        ),
        click.option(
            "--perf-scope",
            type=click.Choice(["cpu", "thread"]),
            default="cpu",
            show_default=True,
            help="cpu: one sampling event per CPU, kept to the target's samples when converted "
            "(cheap for pools that switch often; perf.data is not kept); thread: one event per "
            "target thread (perf.data kept, but every context switch pays for it).",
        ),
        click.option(
            "--force",
            is_flag=True,
            help="Capture even if another profkit is capturing the same process (the target "
            "then pays both budgets); both manifests record the overlap.",
        ),
        click.option("--no-report", is_flag=True, help="Only capture; print no verdict."),
    ]
    for decorator in reversed(decorators):
        function = decorator(function)
    return function
