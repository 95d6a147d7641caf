"""External tools run as children: their own session, killed with profkit, under a watchdog.

Tools are started with their own session, so that a Ctrl-C at the terminal reaches profkit
only and profkit stops each tool in order (SIGINT lets py-spy and perf write their output).
PR_SET_PDEATHSIG makes the kernel stop them if profkit dies outright.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import time
from pathlib import Path

from ...bundle.safefile import open_new

PR_SET_PDEATHSIG = 1
# How often a hurried stop looks whether the tool has ended.
POLL_S = 0.02
_libc = ctypes.CDLL(None, use_errno=True)


def _new_file(path: str, flags: int) -> int:
    return open_new(path)


def _die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class ChildTool:
    """One running external tool with its output files."""

    def __init__(
        self,
        name: str,
        binary: str,
        args: list[str],
        directory: Path,
        stdout_name: str | None = None,
    ) -> None:
        self.name = name
        self.stdout_path = directory / (stdout_name or f"{name}.stdout")
        self.stderr_path = directory / f"{name}.stderr"
        self._stdout = open(self.stdout_path, "wb", opener=_new_file)  # noqa: SIM115 - closed in wait()
        self._stderr = open(self.stderr_path, "wb", opener=_new_file)  # noqa: SIM115
        self.started_ns = time.monotonic_ns()
        # Arguments are passed as a list, never through a shell.
        self._running = subprocess.Popen(
            [binary, *args],
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=self._stderr,
            start_new_session=True,
            # The bundle directory: /proc/PID/cwd then names it, for anyone looking for the
            # tools a capture left (their output paths go through profkit's descriptor).
            cwd=str(directory),
            preexec_fn=_die_with_parent,
        )
        self.pid: int = self._running.pid
        self.exit_code: int | None = None
        # When profkit saw it end, on the bundle clock: py-spy writes its trace just before
        # it exits, so this bounds the trace's last timestamps (None while it runs).
        self.exited_ns: int | None = None
        self.signals_sent: list[str] = []

    def alive(self) -> bool:
        return self._running.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            self._running.send_signal(sig)
            self.signals_sent.append(sig.name)

    def wait(self, timeout: float) -> bool:
        try:
            self._running.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self._finish()
        return True

    def stop(self, grace_s: float = 3.0, hurry: bool = False) -> int | None:
        """SIGINT, then SIGTERM, then SIGKILL: each tool gets the chance to write its output.

        hurry (someone is waiting: Ctrl-C): SIGINT, then SIGKILL once grace_s has passed on the
        clock, whatever the tool was doing; the caller sees that in `killed`."""
        steps = (
            ((signal.SIGINT, grace_s), (signal.SIGKILL, 2.0))
            if hurry
            else ((signal.SIGINT, grace_s), (signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0))
        )
        for sig, wait_s in steps:
            if not self.alive():
                break
            self.signal(sig)
            if self._wait_by_clock(wait_s) if hurry else self.wait(wait_s):
                break
        self._finish()
        return self.exit_code

    def _wait_by_clock(self, timeout: float) -> bool:
        """wait(), against a deadline, polled every POLL_S."""
        deadline = time.monotonic() + timeout
        while self.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))
        self._finish()
        return True

    @property
    def killed(self) -> bool:
        """profkit ended it with SIGTERM or SIGKILL: it may have been cut off mid-work (py-spy
        with the target's threads stopped)."""
        return any(sig in self.signals_sent for sig in ("SIGTERM", "SIGKILL"))

    def _finish(self) -> None:
        if self.exited_ns is None and not self.alive():
            self.exited_ns = time.monotonic_ns()
        if self.exit_code is None and not self.alive():
            # Negative for a signal, as os.waitpid's status reads.
            self.exit_code = self._running.returncode
        for handle in (self._stdout, self._stderr):
            with contextlib.suppress(OSError):
                handle.close()

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
