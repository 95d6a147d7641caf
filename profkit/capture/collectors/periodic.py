"""A background thread that calls a sampling function at a fixed rate on the bundle clock."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from ..clock import NS_PER_S, Clock


class PeriodicSampler:
    def __init__(
        self, name: str, interval_s: float, sample: Callable[[int], bool], clock: Clock
    ) -> None:
        self._interval_ns = int(interval_s * NS_PER_S)
        self._jitter = random.Random()
        self._sample = sample  # returns False when there is nothing left to sample
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"profkit-{name}", daemon=True)
        self.error: BaseException | None = None
        self.exhausted = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        # Deadlines advance by the interval so that a slow sample does not drift the series.
        # Each sample lands at a random point of the middle half of its interval: a fixed
        # phase would lock onto py-spy's period, and the share of samples that find the target
        # stopped (the stop budget's signal) would then be biased by the phase, not the pauses.
        deadline = self._clock()
        try:
            while not self._stop.is_set():
                if not self._sample(self._clock()):
                    self.exhausted = True
                    return
                deadline += self._interval_ns
                offset = int(self._interval_ns * self._jitter.uniform(-0.25, 0.25))
                wait = (deadline + offset - self._clock()) / NS_PER_S
                if wait > 0:
                    self._stop.wait(wait)
                else:
                    deadline = self._clock()
        except BaseException as exc:  # reported in the manifest, never raised into capture
            self.error = exc
