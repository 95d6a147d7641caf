"""`profkit top`: a live terminal view of a process's pools, sites, throttling and findings."""

from __future__ import annotations

import click

from ..errors import EXIT_OK
from ..watch.options import WatchOptions, parse_selectors
from .watch import interval_option, target_options


@click.command()
@target_options
@interval_option(2.0, "Seconds per refresh (one window).")
def top(
    pids: tuple[int, ...],
    matches: tuple[str, ...],
    cgroups: tuple[str, ...],
    name: str | None,
    no_probes: bool,
    interval: float,
) -> int:
    """Show a process's CPU against its quota, its pools, dispatch sites and findings, live."""
    from ..watch.top import run_top

    options = WatchOptions(
        selectors=parse_selectors(pids, matches, cgroups),
        interval_s=interval,
        name=name,
        listen=None,
        probes=not no_probes,
    )
    run_top(options)
    return EXIT_OK
