"""Every subcommand, registered from this one table and imported only when it runs: `attach`
need not load the analysis, nor `report` the capture machinery."""

from __future__ import annotations

import importlib

import click

# command name -> its module here; each module defines a click command of the same name
COMMANDS = {
    "doctor": "doctor",
    "ps": "ps",
    "quota": "quota",
    "attach": "attach",
    "run": "run",
    "report": "report",
    "flame": "flame",
    "timeline": "timeline",
    "export": "export",
    "watch": "watch",
    "top": "top",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported when looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        command = getattr(importlib.import_module(f".{module}", __name__), cmd_name)
        assert isinstance(command, click.Command)
        return command
