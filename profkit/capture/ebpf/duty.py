"""Region probes switched on and off, when keeping them on would cost more than their budget.

A loop of small parallel ops can start tens of thousands of regions a second, and two traps a
region then cost its dispatching thread several percent. Detaching the probes would leave the
pool with no call site at all where py-spy is not in the capture, and that loop is the case a
user most needs one for. So the probes are on for `duty` of the time and off for the rest: the
regions of the on-times are a sample of the window's regions in time, their stacks place the
pool's work, and on average the traps cost what their share of the budget allows. The on-times
go into ebpf.json (regions_decision.on_ns), and the analysis takes the pool's worker time only
from them.

Detaching takes the kernel about 0.1 s a probe (0.7 s for the seven of torch's libgomp,
docs/results/ebpf-cost.md), and the probes may trap until it is done, so each off-time is set
from the on-time just measured, from the first attach to the last detach: on / off = duty /
(1 - duty). The off-times scatter by half either way, so that the sampling does not keep step
with a periodic target. The entries are attached after the ends and detached before them, and
the ends stay on END_GRACE_S longer: a region that starts in an on-time keeps its end.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

PERIOD_S = 2.0
# Below this the on-times are too short and too few to place the pool: the probes are detached.
MIN_DUTY = 0.05
END_GRACE_S = 0.05


@dataclass
class DutyCycle:
    """Switches the probes from a thread of its own; the probes are on when it starts."""

    duty: float
    clock: Callable[[], int]
    # attach(entries) / detach(entries): the entry probes when True, the end probes when False.
    attach: Callable[[bool], None]
    detach: Callable[[bool], None]
    # Regions entered so far, the cost of one and the probes' part of the budget: each on-time
    # measures the rate again and sets the duty from it, as the rate check's 0.3 s ran while
    # the other tools started and can count far fewer regions than the window sees.
    entries: Callable[[], int] | None = None
    cost_s: float = 0.0
    budget: float = 0.0
    on_ns: list[tuple[int, int]] = field(default_factory=list)
    error: str = ""
    _since: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _window: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _random: random.Random = field(default_factory=random.Random)

    def start(self, on_since: int) -> None:
        self._since = on_since
        self._thread = threading.Thread(target=self._run, name="profkit-region-duty", daemon=True)
        self._thread.start()

    def window_opened(self) -> None:
        """The first on-time runs on until duty * PERIOD_S into the window: however short a
        capture, its regions are sampled."""
        self._window.set()

    def _run(self) -> None:
        trapping_since = self._since
        self._window.wait()
        try:
            while True:
                counted, began = self._count(), self.clock()
                if self._wait(self.duty * PERIOD_S):
                    return
                self._adapt(counted, began)
                if self.duty >= 1.0:
                    continue  # fewer regions than the rate check saw: they stay on
                # The on-time ends as the first entry probe goes off: from then on regions go
                # unseen, and their workers' time would be given to the last region seen.
                self._close()
                self.detach(True)
                if self._wait(END_GRACE_S):
                    return
                self.detach(False)
                trapped_s = (self.clock() - (trapping_since or 0)) / 1e9
                off_s = trapped_s * (1 - self.duty) / self.duty
                if self._wait(off_s * self._random.uniform(0.5, 1.5)):
                    return
                trapping_since = self.clock()
                self.attach(False)
                # Open before the entries go on: should one of them fail, the regions of those
                # already on still lie in an on-time.
                self._since = self.clock()
                self.attach(True)
        except Exception as exc:  # the target left, or the kernel refused: switching stops,
            # and cleanup detaches what is on
            self.error = f"region probes stopped switching: {exc}"
            self._close()

    def _count(self) -> int:
        return self.entries() if self.entries is not None else 0

    def _adapt(self, counted: int, began: int) -> None:
        """The duty from the rate of the on-time just ended."""
        seconds = (self.clock() - began) / 1e9
        if self.entries is None or seconds <= 0 or self.cost_s <= 0:
            return
        share = (self._count() - counted) / seconds * self.cost_s
        if share > 0:
            self.duty = min(1.0, max(MIN_DUTY, self.budget / share))

    def _wait(self, seconds: float) -> bool:
        """Sleep; True when stopped meanwhile."""
        return self._stop.wait(seconds)

    def _close(self) -> None:
        if self._since is not None:
            self.on_ns.append((self._since, self.clock()))
            self._since = None

    def stop(self) -> list[tuple[int, int]]:
        """Stop switching (the probes stay as they are; cleanup detaches them) and return the
        on-times, the last one closed now."""
        self._stop.set()
        self._window.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._close()
        return self.on_ns

    @property
    def probed_s(self) -> float:
        return sum(end - start for start, end in self.on_ns) / 1e9
