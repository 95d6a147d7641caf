"""`profkit top`: the watch pipeline as a live terminal view, one window a second or two."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import threading
import tty
from collections.abc import Iterator

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..errors import EXIT_OK
from .agent import Agent, leave
from .options import WatchOptions
from .series import TargetSeries


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def render(agent: Agent, notes: list[str] | None = None) -> Group:
    parts: list[RenderableType] = []
    pids: dict[tuple[str, ...], list[int]] = {}
    for watched, labels in agent.processes.values():
        pids.setdefault(labels, []).append(watched.pid)
    header = Text(
        f"profkit top  {agent.options.selectors.describe()}  window {agent.options.interval_s:g} s"
        "  (q quits)",
        style="bold",
    )
    parts.append(header)
    live = [s for s in agent.series.values() if s.live and s.last is not None]
    if not live:
        waiting = "waiting for the first window" if agent.processes else "no target running"
        parts.append(Text(waiting, style="yellow"))
    for series in live:
        parts.extend(_target(series, pids.get(series.labels, [])))
    for note in (notes or [])[-4:]:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)


def _target(series: TargetSeries, pids: list[int]) -> list[RenderableType]:
    last = series.last
    assert last is not None
    name = series.labels[0] + (f" ({series.labels[2]})" if series.labels[2] else "")
    quota = (
        f"of a {last.quota_cores:g}-core quota ({last.quota_source})"
        if last.quota_cores is not None
        else "(no CPU quota)"
    )
    summary = Text()
    summary.append(f"\n{name}", style="bold cyan")
    summary.append(f"  pid {', '.join(map(str, sorted(pids))) or '-'}\n")
    summary.append(f"process CPU {last.process_cores:.2f} cores {quota}")
    summary.append(f"   Python threads {last.python_cores:.2f} cores\n")
    summary.append(f"throttled {_pct(last.throttled_pct)} of periods", style="red")
    summary.append(f"   recommended threads {last.recommended_threads}")
    pools = Table(title=None, box=None, pad_edge=False, header_style="bold")
    for column in ("pool", "threads", "CPU cores", "regions/s"):
        pools.add_column(column, justify="right" if column != "pool" else "left")
    for runtime, (cores, rate, team) in last.pools.items():
        duty = series.probe_duty.get(runtime, 1.0)
        # Switched, the probe counts its on-times' regions only: the rate is scaled up to the
        # window, an estimate.
        shown = f"~{rate / duty:,.0f} (probe on {100 * duty:.0f}%)" if duty < 1 else f"{rate:,.0f}"
        pools.add_row(runtime, str(team), f"{cores:.2f}", shown)
    sites = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("dispatch site", "function", "op", "CPU cores", "share"):
        sites.add_column(column, justify="right" if column in ("CPU cores", "share") else "left")
    total = sum(cores for _, _, cores in last.sites) or 1.0
    for _, key, cores in last.sites[:10]:
        sites.add_row(
            key.site, key.function, key.op or "-", f"{cores:.2f}", f"{100 * cores / total:.0f}%"
        )
    parts: list[RenderableType] = [summary, pools]
    if last.sites:
        parts.append(sites)
    if series.active:
        for finding in series.active:
            parts.append(Text(f"[{finding.severity}] {finding.id}: {finding.summary}", style="red"))
            parts.append(Text(f"    fix: {finding.fix}"))
    else:
        parts.append(Text("no finding holds", style="green"))
    return parts


@contextlib.contextmanager
def keys(stop: threading.Event) -> Iterator[None]:
    """Read single keys from a terminal on a thread; `q` sets stop."""
    if not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready and os.read(fd, 1) in (b"q", b"Q"):
                stop.set()

    thread = threading.Thread(target=read, name="profkit-keys", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Native libraries (bcc's compiler) write to fd 2, which would tear the full-screen view;
    profkit's own notes go into the view instead."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def run_top(options: WatchOptions) -> None:
    notes: list[str] = []
    agent = Agent(options, notify=notes.append)
    agent.install_signals()
    agent.start()
    console = Console()
    with (
        keys(agent.stop),
        quiet_stderr(),
        Live(render(agent), console=console, screen=True, auto_refresh=False) as live,
    ):
        live.refresh()

        def redraw(current: Agent) -> None:
            live.update(render(current, notes), refresh=True)

        agent.run(on_window=redraw)
    leave(agent, EXIT_OK)  # the screen is restored by now
