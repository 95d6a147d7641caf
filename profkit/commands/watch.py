"""`profkit watch`: a long-running agent exporting fan-out and throttling metrics and profiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..capture.collectors.base import EbpfLoader
from ..errors import EXIT_OK
from ..watch.options import (
    DEFAULT_LISTEN,
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    WatchOptions,
    check_expire,
    check_interval,
    parse_listen,
    parse_push,
    parse_selectors,
)

F = TypeVar("F", bound=Callable[..., Any])


def target_options(function: F) -> F:
    """The target selectors `watch` and `top` share."""
    decorators = [
        click.option(
            "--pid", "-p", "pids", type=int, multiple=True, help="A target pid (repeatable)."
        ),
        click.option(
            "--match",
            "-m",
            "matches",
            multiple=True,
            help="Every Python process whose command line matches this regex, as `ps --match` "
            "(repeatable); new ones are picked up at each interval.",
        ),
        click.option(
            "--cgroup",
            "cgroups",
            multiple=True,
            help="Every Python process in this cgroup or below it, e.g. /kubepods.slice "
            "(repeatable).",
        ),
        click.option(
            "--name",
            help="The target label of every process watched (default: the command's short name: "
            "a script's or module's name).",
        ),
        click.option(
            "--no-probes",
            is_flag=True,
            help="No eBPF region probe: /proc and cgroup counters only (no regions, no sites).",
        ),
    ]
    for decorator in reversed(decorators):
        function = decorator(function)
    return function


def _interval(ctx: click.Context, param: click.Parameter, value: float) -> float:
    return check_interval(value)


def interval_option(default: float, help_text: str) -> Callable[[F], F]:
    """--interval, refused while the options are parsed (exit 2) unless finite and in range:
    before a port is bound or a target looked at."""
    return click.option(
        "--interval",
        type=float,
        default=default,
        show_default=True,
        callback=_interval,
        help=f"{help_text} From {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} s.",
    )


@click.command()
@target_options
@interval_option(
    15.0, "Seconds per window: metrics, findings and the profile are updated this often."
)
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    help="HOST:PORT of the Prometheus endpoint (/metrics).",
)
@click.option(
    "--profiles",
    "profiles_dir",
    type=click.Path(file_okay=False),
    help="Write each window's merged profile (pprof) to DIR/<target>/ (rolling).",
)
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=240,
    show_default=True,
    help="Profiles kept per target in --profiles.",
)
@click.option(
    "--push",
    "push_url",
    help="Base URL of a Pyroscope-compatible server: each profile is posted to URL/ingest.",
)
@click.option(
    "--ebpf-loader",
    type=click.Choice(["auto", "core", "bcc"]),
    default="auto",
    show_default=True,
    help="How the region probes load: the prebuilt CO-RE object (a kernel with BTF), or bcc "
    "compiling them here; auto takes CO-RE wherever it loads (as attach's option).",
)
@click.option(
    "--expire",
    type=float,
    help="Seconds after its last process exits that a target's series leave the metrics "
    "[default: 4 intervals, at least 60 s].",
)
def watch(
    pids: tuple[int, ...],
    matches: tuple[str, ...],
    cgroups: tuple[str, ...],
    name: str | None,
    no_probes: bool,
    interval: float,
    listen: str,
    profiles_dir: str | None,
    keep: int,
    push_url: str | None,
    ebpf_loader: EbpfLoader,
    expire: float | None,
) -> int:
    """Watch processes continuously: Prometheus metrics, findings and pprof profiles."""
    from ..watch.agent import Agent, leave

    options = WatchOptions(
        selectors=parse_selectors(pids, matches, cgroups),
        interval_s=interval,
        name=name,
        listen=parse_listen(listen),
        profiles_dir=profiles_dir,
        keep_profiles=keep,
        push_url=parse_push(push_url) if push_url else None,
        probes=not no_probes,
        ebpf_loader=ebpf_loader,
        expire_s=check_expire(expire, interval),
    )
    agent = Agent(options)
    agent.install_signals()
    agent.start()
    click.echo(
        f"profkit: serving metrics on http://{options.listen}/metrics, a window every "
        f"{interval:g} s",
        err=True,
    )
    agent.run()
    click.echo("profkit: stopped; every probe detached", err=True)
    return leave(agent, EXIT_OK)
