"""`profkit export BUNDLE --format folded|speedscope|pprof|pstats`: formats for other tools."""

from __future__ import annotations

from pathlib import Path

import click

from ..analysis.pipeline import analyse_bundle
from ..analysis.stacks import VIEWS, build
from ..render.exports import folded, pprof, pstats, speedscope
from .options import mode_option
from .output import write_output

EXTENSIONS = {
    "folded": ".folded",
    "speedscope": ".speedscope.json",
    "pprof": ".pb.gz",
    "pstats": ".prof",
}


@click.command()
# Not click's readable check: the loader says why a bundle cannot be read (exit 5 or 8).
@click.argument("bundle", type=click.Path(file_okay=False, readable=False))
@click.option("--format", "fmt", type=click.Choice(list(EXTENSIONS)), required=True)
@click.option("--view", type=click.Choice(VIEWS), default="merged", show_default=True)
@click.option("--output", "-o", help="File to write (default: the bundle name + extension).")
@mode_option
def export(bundle: str, fmt: str, view: str, output: str | None, mode: int) -> None:
    """Export stacks as folded text, speedscope JSON, gzipped pprof or a pstats file (what
    cProfile writes: pstats, snakeviz, flameprof and gprof2dot read it)."""
    report = analyse_bundle(bundle)
    stacks = build(report, view)
    path = Path(output or (Path(bundle).name + EXTENSIONS[fmt]))
    if fmt == "pprof":
        data: str | bytes = pprof(stacks)
    elif fmt == "pstats":
        data = pstats(stacks)
    elif fmt == "speedscope":
        data = speedscope(stacks, f"profkit {view} {Path(bundle).name}")
    else:
        data = folded(stacks)
    write_output(path, data, mode)
    click.echo(f"wrote {path} ({fmt}, {view} view, {stacks.total_seconds:.2f} s)")
