"""Options shared by several subcommands, declared once."""

from __future__ import annotations

import click

pid_option = click.option("--pid", "-p", type=int, required=True, help="Target process id.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")


def capture_options(function):  # type: ignore[no-untyped-def]
    """Options shared by `attach` and `run`."""
    decorators = [
        click.option(
            "--duration",
            "-d",
            type=float,
            default=10.0,
            show_default=True,
            help="Seconds to capture.",
        ),
        click.option(
            "--out",
            "-o",
            "out",
            type=click.Path(file_okay=False),
            help="Bundle directory (default: profkit-sessions/PID-TIME).",
        ),
        click.option(
            "--rate",
            "-r",
            type=int,
            default=None,
            help="py-spy sampling rate in Hz (default: up to 10, chosen from the target's "
            "thread and CPU counts so that py-spy's pauses and its own CPU fit their parts "
            "of --budget: 35% and 15%, the pauses 70% where no eBPF probe runs).",
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
            "stop_budget",
            type=float,
            default=2.0,
            show_default=True,
            help="Most % of the target's throughput profkit may cost it: sets py-spy's rate "
            "and mode, whether the scheduler is traced and whether the OpenMP region probes "
            "stay on, each held to its part; if the target is seen stopped more than twice "
            "this share of its time (95% confidence) or for 1 s at once, py-spy goes "
            "--nonblocking.",
        ),
        click.option(
            "--ebpf-sched",
            type=click.Choice(["auto", "on", "off"]),
            default="auto",
            show_default=True,
            help="Scheduler tracepoints (slices, wakeups): auto traces them unless the machine's "
            "context-switch rate says they would cost more than their part (20%) of --budget.",
        ),
        click.option(
            "--python-stacks",
            type=click.Choice(["auto", "off"]),
            default="auto",
            show_default=True,
            help="auto: the eBPF walker reads each parallel region's Python stack and samples "
            "the Python threads on CPU, without stopping them (CPython 3.10-3.13); where it "
            "cannot, py-spy joins the default collectors. off: no walker.",
        ),
        click.option(
            "--cpu-budget",
            type=float,
            default=0.5,
            show_default=True,
            help="Most CPU (cores) profkit and its tools may use; over it a collector stops.",
        ),
        click.option(
            "--collectors",
            "-c",
            help="Comma-separated subset of ebpf, proc, cgroup, perf_stat, perf_record, pyspy, "
            "or all (default: ebpf, proc, cgroup, perf_record, and pyspy where the eBPF walker "
            "cannot read the target's Python stacks).",
        ),
        click.option(
            "--max-size",
            "max_size_mb",
            type=float,
            default=256.0,
            show_default=True,
            help="Bundle size bound in MB.",
        ),
        click.option(
            "--perf-callgraph",
            type=click.Choice(["fp", "dwarf"]),
            default="fp",
            show_default=True,
            help="perf unwinding (dwarf: whole stacks, ~100x data).",
        ),
        click.option(
            "--perf-rate",
            type=int,
            default=49,
            show_default=True,
            help="perf cpu-clock sampling rate in Hz.",
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
        click.option("--no-report", is_flag=True, help="Only capture; print no verdict."),
    ]
    for decorator in reversed(decorators):
        function = decorator(function)
    return function
