"""`profkit report BUNDLE`: analyse a saved bundle (no root needed) and print the verdict."""

from __future__ import annotations

import click

from ..analysis.pipeline import analyse_bundle
from ..render.html_report import render_html
from ..render.json_report import render_json
from ..render.text import render_text
from .options import mode_option
from .output import write_output

RENDERERS = {"text": render_text, "json": render_json, "html": render_html}


@click.command()
# Not click's readable check: the loader says why a bundle cannot be read (exit 5 or 8).
@click.argument("bundle", type=click.Path(file_okay=False, readable=False))
@click.option(
    "--format", "fmt", type=click.Choice(list(RENDERERS)), default="text", show_default=True
)
@click.option("--output", "-o", help="Write to this file instead of standard output.")
@mode_option
def report(bundle: str, fmt: str, output: str | None, mode: int) -> None:
    """Reconcile, attribute and diagnose a captured session bundle."""
    text = RENDERERS[fmt](analyse_bundle(bundle))
    if output:
        write_output(output, text, mode)
        click.echo(f"wrote {output}")
    else:
        click.echo(text)
