"""What the commands share to hand their results over: the files they write, and what
`attach` and `run` show while the capture runs and print when it ends."""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import click

from ..bundle.safefile import replace_file
from ..capture.session import Progress
from ..errors import OutputError
from ..render.table import table


def write_output(path: str | Path, data: str | bytes, mode: int = 0o600) -> None:
    """Written under a fresh name and renamed into place: a link at path is replaced, never
    written through, and the file has exactly `mode`."""
    try:
        replace_file(path, data, mode)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from exc


# What print_outcome imports for the report, a tenth of a second or more.
REPORT_MODULES = ("profkit.analysis.pipeline", "profkit.render.text")


def import_report_meanwhile() -> None:
    """Import the report's modules on a thread of their own while the capture starts (its
    start-up waits on the probes' rate check), rather than between the window's end and the
    prompt."""

    def load() -> None:
        for name in REPORT_MODULES:
            importlib.import_module(name)

    threading.Thread(target=load, name="profkit-report-imports", daemon=True).start()


def print_outcome(directory: Path, manifest: dict, report: bool) -> None:
    if sys.stderr.isatty():
        click.echo("", err=True)
    window = manifest["window"]
    seconds = (window["end_ns"] - window["start_ns"]) / 1e9
    status = manifest["status"] + (
        f" ({manifest['status_reason']})" if manifest["status_reason"] else ""
    )
    click.echo(f"bundle {directory}  {seconds:.1f} s  {status}")
    rows = []
    for name, result in manifest["collectors"].items():
        rows.append((name, result["status"], result["samples"], result["lost"], result["reason"]))
    click.echo(
        table(
            ("collector", "status", "samples", "lost", "note"),
            rows,
            (12, 11, 8, 5, 0),
            wrap_last=38,
        )
    )
    if report:
        from ..analysis.pipeline import analyse_bundle
        from ..render.text import render_text

        click.echo("")
        click.echo(render_text(analyse_bundle(directory)))


def progress_printer(stream: TextIO = sys.stderr) -> Callable[[Progress], None] | None:
    """A one-line live display on a terminal; nothing when output is not a TTY."""
    if not stream.isatty():
        return None
    last = [0.0]

    def tick(progress: Progress) -> None:
        if progress.elapsed_s - last[0] < 0.4:
            return
        last[0] = progress.elapsed_s
        parts = [f"{progress.elapsed_s:5.1f}s"]
        if progress.cores is not None:
            parts.append(f"{progress.cores:.2f} cores")
        if progress.throttled_pct is not None:
            parts.append(f"throttled {progress.throttled_pct:.0f}%")
        parts += [f"{name} {count}" for name, count in progress.samples.items()]
        stream.write("\r" + "  ".join(parts)[:100].ljust(100))
        stream.flush()

    return tick
