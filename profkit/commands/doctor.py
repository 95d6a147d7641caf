"""`profkit doctor`: every capability profkit uses, probed, with the reason and the fix."""

from __future__ import annotations

import json
import os

import click

from ..errors import EXIT_CAPABILITY, EXIT_OK, NoSuchProcess
from ..host.capabilities import NOT_NEEDED, OK, run_checks
from ..render.table import table
from .options import json_option


@click.command()
@click.option(
    "--pid",
    type=int,
    help="Also name this target's Python: its version, its build (shared or static "
    "libpython) and where the walker's layout comes from.",
)
@json_option
def doctor(pid: int | None, as_json: bool) -> int:
    """Check what this machine lets profkit do (exit 7 if a core capability is missing)."""
    if pid is not None and not os.path.exists(f"/proc/{pid}"):
        raise NoSuchProcess(f"pid {pid}: no such process")
    checks = run_checks(pid)
    core_ok = all(c.passed for c in checks if c.core)
    if as_json:
        click.echo(
            json.dumps({"core_ok": core_ok, "checks": [c.as_dict() for c in checks]}, indent=2)
        )
    else:
        rows = [(c.name, c.status + ("*" if c.core else ""), c.detail) for c in checks]
        click.echo(table(("capability", "status", "detail"), rows, (22, 12, 0), wrap_last=42))
        fixes = [(c.name, c.fix) for c in checks if c.fix and c.status not in (OK, NOT_NEEDED)]
        if fixes:
            click.echo("\nto fix:")
            for name, fix in fixes:
                click.echo(f"  {name}: {fix}")
        click.echo("\n* core capability" + ("" if core_ok else ": MISSING, profkit cannot attach"))
    return EXIT_OK if core_ok else EXIT_CAPABILITY
