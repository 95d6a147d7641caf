"""The `profkit` command: a click group, one module per subcommand, errors caught here only."""

from __future__ import annotations

import sys

import click

from . import __version__
from .commands import LazyGroup
from .errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ProfkitError,
    fail_unexpected,
)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="profkit")
def cli() -> None:
    """Native-level profiling of PyTorch CPU thread-pool fanout on live processes."""


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(argv))


def run(argv: list[str] | None = None) -> int:
    try:
        result = cli.main(args=argv, prog_name="profkit", standalone_mode=False)
    except ProfkitError as exc:
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        click.echo(f"profkit: error: {exc.format_message()}{hint}", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        click.echo(f"profkit: error: {exc.format_message()}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("profkit: interrupted", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        return fail_unexpected(exc)
    return result if isinstance(result, int) else EXIT_OK if result is None else EXIT_ERROR
