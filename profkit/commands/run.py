"""`profkit run -- CMD`: start a command, let it warm up, then attach to it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from typing import Any

import click

from ..autothreads import environment
from ..errors import CaptureFailed, UsageError
from ..host.target import inspect
from .attach import run_capture
from .options import Number, capture_options


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--delay",
    type=Number(float, 0, 3600, unit=" s"),
    default=2.0,
    show_default=True,
    help="Seconds the command runs before the capture starts.",
)
@click.option("--keep-running", is_flag=True, help="Leave the command running afterwards.")
@click.option(
    "--cap-threads",
    is_flag=True,
    help="Set OMP/MKL/OPENBLAS_NUM_THREADS from the effective CPU quota.",
)
@capture_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    delay: float, keep_running: bool, cap_threads: bool, command: tuple[str, ...], **options: Any
) -> int:
    """Start COMMAND, wait --delay seconds, capture it, then stop it."""
    if delay < 0:
        raise UsageError(f"--delay must be >= 0, got {delay:g}")
    env = None
    if cap_threads:
        env, cap = environment()
        click.echo(cap.describe(), err=True)
    try:
        process = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        raise UsageError(f"cannot start {command[0]}: {exc.strerror}") from exc
    try:
        time.sleep(delay)
        if process.poll() is not None:
            raise CaptureFailed(
                f"{command[0]} exited with {process.returncode} before the capture started"
            )
        return run_capture(inspect(process.pid), **options)
    finally:
        if not keep_running:
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGINT, 5.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait_s)
