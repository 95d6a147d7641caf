"""`profkit flame BUNDLE -o FILE.svg`: an interactive flame graph of a saved bundle."""

from __future__ import annotations

import click

from ..analysis.pipeline import analyse_bundle
from ..analysis.stacks import VIEWS, build
from ..render.flame_svg import render_svg
from .options import mode_option
from .output import write_output


@click.command()
# Not click's readable check: the loader says why a bundle cannot be read (exit 5 or 8).
@click.argument("bundle", type=click.Path(file_okay=False, readable=False))
@click.option("--output", "-o", required=True, help="SVG file to write.")
@click.option("--view", type=click.Choice(VIEWS), default="merged", show_default=True)
@click.option(
    "--diff",
    "diff_bundle",
    type=click.Path(file_okay=False, readable=False),
    help="Colour frames by how their share changed against this other bundle.",
)
@mode_option
def flame(bundle: str, output: str, view: str, diff_bundle: str | None, mode: int) -> None:
    """Render a flame graph: merged, python, workers or offcpu."""
    report = analyse_bundle(bundle)
    stacks = build(report, view)
    other = build(analyse_bundle(diff_bundle), view) if diff_bundle else None
    pid = report.bundle.manifest.target.pid
    title = f"profkit {view} flame graph, pid {pid}" + (
        f" (diff against {diff_bundle})" if diff_bundle else ""
    )
    write_output(output, render_svg(stacks, title, other), mode)
    click.echo(f"wrote {output}: {stacks.total_seconds:.2f} s of {view} samples")
