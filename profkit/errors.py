"""One error hierarchy; every exit code profkit can return is defined here (docs/exit-codes.md)."""

from __future__ import annotations

import sys

import click

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO_SUCH_PROCESS = 3
EXIT_NOT_PYTHON = 4
EXIT_PERMISSION = 5
EXIT_TARGET_CHANGED = 6
EXIT_CAPABILITY = 7
EXIT_BAD_BUNDLE = 8
EXIT_CAPTURE = 9
EXIT_CGROUP = 10
EXIT_OUTPUT = 11
EXIT_BUSY = 12
EXIT_LISTEN = 13
EXIT_INTERRUPTED = 130


class ProfkitError(click.ClickException):
    """Base of every error profkit reports: one line on stderr and a documented exit code."""

    exit_code = EXIT_ERROR

    def show(self, file: object = None) -> None:
        click.echo(f"profkit: error: {self.format_message()}", err=True)


class UsageError(ProfkitError):
    exit_code = EXIT_USAGE


class NoSuchProcess(ProfkitError):
    exit_code = EXIT_NO_SUCH_PROCESS


class NotPythonTarget(ProfkitError):
    exit_code = EXIT_NOT_PYTHON


class PermissionDenied(ProfkitError):
    exit_code = EXIT_PERMISSION


class TargetChanged(ProfkitError):
    """The pid now names another process than the one that was inspected (pid reuse)."""

    exit_code = EXIT_TARGET_CHANGED


class CapabilityMissing(ProfkitError):
    exit_code = EXIT_CAPABILITY


class BadBundle(ProfkitError):
    exit_code = EXIT_BAD_BUNDLE


class CaptureFailed(ProfkitError):
    exit_code = EXIT_CAPTURE


class CgroupError(ProfkitError):
    exit_code = EXIT_CGROUP


class OutputError(ProfkitError):
    exit_code = EXIT_OUTPUT


class TargetBusy(ProfkitError):
    """Another profkit is capturing the same process (pid and start time)."""

    exit_code = EXIT_BUSY


class ListenError(ProfkitError):
    """`watch`: the metrics address cannot be bound (port in use, address not on this host)."""

    exit_code = EXIT_LISTEN


def fail_unexpected(exc: BaseException) -> int:
    """Last resort for errors no command anticipated: one line, never a traceback by default."""
    kind = type(exc).__name__
    click.echo(
        f"profkit: error: unexpected {kind}: {exc} (PROFKIT_DEBUG=1 shows the traceback)", err=True
    )
    if "PROFKIT_DEBUG" in __import__("os").environ:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    return EXIT_ERROR
