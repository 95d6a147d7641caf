"""What Ctrl-C and SIGTERM do during a capture: abort the start-up (the bundle is marked
aborted), end the window early (the bundle is kept and marked partial), and nothing at all
while the tools are being stopped.

Only the main thread may set signal handlers; called from another thread, both do nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[list[str]]:
    """SIGINT/SIGTERM set stop; yields the names of the signals received."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def teardown_shielded() -> Iterator[None]:
    """Ignore further Ctrl-C while probes and tools are being stopped (each stop is bounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """A SIGINT aborts the start-up too where the process inherited it ignored (a script's
    background job does): the window honours it whatever the inherited disposition, and a
    SIGINT lost while the probes load would leave the capture running its whole window."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    ):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
