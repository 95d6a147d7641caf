"""`profkit export BUNDLE --format folded|speedscope|pprof`: standard formats for other tools."""

from __future__ import annotations

from pathlib import Path

import click

from ..analysis.pipeline import analyse_bundle
from ..analysis.stacks import VIEWS, build
from ..errors import OutputError
from ..render.exports import folded, pprof, speedscope

EXTENSIONS = {"folded": ".folded", "speedscope": ".speedscope.json", "pprof": ".pb.gz"}


@click.command()
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(list(EXTENSIONS)), required=True)
@click.option("--view", type=click.Choice(VIEWS), default="merged", show_default=True)
@click.option("--output", "-o", help="File to write (default: the bundle name + extension).")
def export(bundle: str, fmt: str, view: str, output: str | None) -> None:
    """Export stacks as folded text, speedscope JSON or gzipped pprof."""
    report = analyse_bundle(bundle)
    stacks = build(report, view)
    path = Path(output or (Path(bundle).name + EXTENSIONS[fmt]))
    try:
        if fmt == "pprof":
            path.write_bytes(pprof(stacks))
        elif fmt == "speedscope":
            path.write_text(speedscope(stacks, f"profkit {view} {Path(bundle).name}"))
        else:
            path.write_text(folded(stacks))
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from exc
    click.echo(f"wrote {path} ({fmt}, {view} view, {stacks.total_seconds:.2f} s)")
