"""Options shared by several subcommands, declared once."""

from __future__ import annotations

import click

pid_option = click.option("--pid", "-p", type=int, required=True, help="Target process id.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
