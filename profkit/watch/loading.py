"""Region probes load on a thread of their own, off the window loop.

Loading a probe compiles and attaches it, which takes seconds per target: done inside the loop,
six new targets held every window (and SIGTERM) back by over ten seconds. The loader takes one
process at a time, in the order they were found; each window reads /proc and the cgroup of every
process whether or not its probe is ready, and reads a probe only once it is.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from .process import WatchedProcess

# A stop waits this long for the load in progress, then exits without it: a compile attaches
# nothing until it ends, and what an attach makes is held by descriptors (perf-event uprobes)
# that the kernel closes with the process. A compile can take seconds on a busy machine, which
# a stop (5 s at most, docs/watch.md) does not wait for.
STOP_WAIT_S = 1.0


class ProbeLoader:
    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._queue: queue.Queue[tuple[WatchedProcess, Callable[[], None]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="profkit-probe-load", daemon=True)
        self._thread.start()

    def submit(self, watched: WatchedProcess, on_loaded: Callable[[], None]) -> None:
        """Load watched's probe, then call on_loaded (on the loader's thread)."""
        self._queue.put((watched, on_loaded))

    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._stop.is_set():
                return
            watched, on_loaded = item
            watched.load_probe()
            if not self._stop.is_set():
                on_loaded()

    def close(self, timeout: float = STOP_WAIT_S) -> bool:
        """False when a load was still in progress after timeout (left to the process's exit)."""
        self._queue.put(None)
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()
