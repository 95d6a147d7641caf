"""`profkit timeline BUNDLE -o trace.json`: a Chrome/Perfetto trace of the capture."""

from __future__ import annotations

import click

from ..analysis.pipeline import analyse_bundle
from ..render.timeline import render_timeline
from .options import mode_option
from .output import write_output


@click.command()
# Not click's readable check: the loader says why a bundle cannot be read (exit 5 or 8).
@click.argument("bundle", type=click.Path(file_okay=False, readable=False))
@click.option("--output", "-o", required=True, help="Trace JSON file to write.")
@mode_option
def timeline(bundle: str, output: str, mode: int) -> None:
    """Threads on and off CPU, parallel regions, py-spy samples and throttling over time."""
    write_output(output, render_timeline(analyse_bundle(bundle)), mode)
    click.echo(f"wrote {output}")
