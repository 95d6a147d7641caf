"""`profkit report BUNDLE`: analyse a saved bundle (no root needed) and print the verdict."""

from __future__ import annotations

import click

from ..analysis.pipeline import analyse_bundle
from ..render.json_report import render_json
from ..render.text import render_text


@click.command()
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def report(bundle: str, fmt: str) -> None:
    """Reconcile, attribute and diagnose a captured session bundle."""
    result = analyse_bundle(bundle)
    click.echo(render_json(result) if fmt == "json" else render_text(result))
