"""Region probes switched on and off, when keeping them on would cost more than their budget.

A loop of small parallel ops can start tens of thousands of regions a second, and two traps a
region then cost its dispatching thread several percent. Detaching the probes would leave the
pool with no call site at all where py-spy is not in the capture, and that loop is the case a
user most needs one for. So the probes are on for `duty` of the time and off for the rest: the
regions of the on-times are a sample of the window's regions in time, their stacks place the
pool's work, and on average the traps cost what their part of the budget allows. The on-times
go into ebpf.json (regions_decision.on_ns), and the analysis takes the pool's worker time only
from them.

The two edges of an on-time do not cost the same. Attaching is cheap, but detaching the
probes of torch's libgomp costs a busy serving front tens of milliseconds of its work each time
(docs/results/ebpf-cost.md#switching-what-each-edge-costs), so an on-time every couple of
seconds cost it as much as the traps it saved. Hence the schedule: the probes come off once the
rate check has decided, before the window opens; the window is cut into periods of PERIOD_S (a
window of less than one and a half is one period), and each period is off for the first
(1 - duty) of it and on for the rest. The last on-time runs to the window's end, and its
probes come off at teardown, after the window, so a capture of one period detaches nothing
inside its window. The off-times of the periods before the last scatter by half either way, so
that the sampling does not keep step with a periodic target. The entries are attached after the
ends and detached before them, and the ends stay on END_GRACE_S longer: a region that starts in
an on-time keeps its end.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .policy import RegionCount, RegionDecision, Spent, as_switched, count_between, next_duty

# At this length one detach a period is a small fraction of a percent of a serving front's work
# (a detach's cost: docs/results/ebpf-cost.md#switching-what-each-edge-costs).
PERIOD_S = 30.0
END_GRACE_S = 0.05
# The rate check's 0.3 s run while the other tools start, and count fewer regions than the
# window sees (docs/results/ebpf-cost.md#switched-on-and-off-a-flood-of-small-regions): a
# one-period capture has no later on-time to correct its duty from, so the regions are counted
# again, once the check has decided, for this long before the probes come off.
RECOUNT_S = 0.3


@dataclass
class DutyCycle:
    """Switches the probes from a thread of its own; start() takes them off."""

    decision: RegionDecision  # the rate check's: its duty, the probes' part of the budget
    clock: Callable[[], int]
    # attach(entries) / detach(entries): the entry probes when True, the end probes when False.
    attach: Callable[[bool], None]
    detach: Callable[[bool], None]
    # The window's length: None for a capture that runs until stopped.
    window_s: float | None = None
    # What the probes have spent so far (policy.Spent): each on-time but the last measures the
    # rate and the cost a region again and sets the next period's duty from them, as the rate
    # check's 0.3 s ran while the other tools started and can count far fewer regions than the
    # window sees.
    measure: Callable[[], Spent] | None = None
    period_s: float = PERIOD_S
    # The probes are on as the switching starts, and the first period begins with its on-time
    # (`watch`, whose probes were on before their rate was judged and have no window to wait
    # for): no detach until that on-time ends.
    start_on: bool = False
    on_ns: list[tuple[int, int]] = field(default_factory=list)
    recounted_per_s: float = 0.0
    last: RegionCount | None = None  # the count the duty was last set from
    error: str = ""
    _since: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _window: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _random: random.Random = field(default_factory=random.Random)
    duty: float = 1.0

    def __post_init__(self) -> None:
        self.duty = self.decision.duty
        self.last = self.decision.count

    @property
    def outcome(self) -> RegionDecision:
        """The decision as the switching left it, for ebpf.json."""
        return as_switched(self.decision, self.last or self.decision.count, self.duty)

    def start(self, recounted_per_s: float | None = None) -> None:
        """Count the regions again and set the duty from that rate (unless the caller has just
        counted them and set it), take the probes off (before the window opens: the detach is
        the costly edge) and start switching them once it does."""
        if recounted_per_s is None:
            counted, began = self._measured(), self.clock()
            self._wait(RECOUNT_S)
            recounted_per_s = self._adapt(counted, began)
        self.recounted_per_s = recounted_per_s
        if not self.start_on:
            self.detach(True)
            self.detach(False)
        self._thread = threading.Thread(target=self._run, name="profkit-region-duty", daemon=True)
        self._thread.start()

    def window_opened(self) -> None:
        self._window.set()

    def _run(self) -> None:
        self._window.wait()
        end_ns = None if self.window_s is None else self.clock() + int(self.window_s * 1e9)
        on = self.start_on
        if on:
            self._since = self.clock()
        try:
            while True:
                left_s = float("inf") if end_ns is None else (end_ns - self.clock()) / 1e9
                # A tail shorter than half a period joins the last one.
                last = left_s < 1.5 * self.period_s
                period_s = left_s if last else self.period_s
                if not on:
                    scatter = 1.0 if last else self._random.uniform(0.5, 1.5)
                    if self._wait((1 - self.duty) * period_s * scatter):
                        return
                    self.attach(False)
                    # Open before the entries go on: should one of them fail, the regions of
                    # those already on still lie in an on-time.
                    self._since = self.clock()
                    self.attach(True)
                    on = True
                if last:
                    self._stop.wait()  # on until the window ends; teardown detaches
                    return
                counted, began = self._measured(), self.clock()
                if self._wait(self.duty * period_s):
                    return
                self._adapt(counted, began)
                if self.duty >= 1.0:
                    continue  # fewer regions than counted before: they stay on, no detach
                # The on-time ends as the first entry probe goes off: from then on regions go
                # unseen, and their workers' time would be given to the last region seen.
                self._close()
                self.detach(True)
                if self._wait(END_GRACE_S):
                    return
                self.detach(False)
                on = False
        except Exception as exc:  # the target left, or the kernel refused: switching stops,
            # and cleanup detaches what is on
            self.error = f"region probes stopped switching: {exc}"
            self._close()

    def _measured(self) -> Spent:
        return self.measure() if self.measure is not None else Spent()

    def _adapt(self, counted: Spent, began: int) -> float:
        """The duty from the rate and the cost a region of the on-time just ended; that rate
        (0 if none)."""
        if self.measure is None:
            return 0.0
        count = count_between(counted, self._measured(), (self.clock() - began) / 1e9)
        if count is None:
            return 0.0
        self.last = count
        self.duty = next_duty(self.decision, count)
        return count.per_s

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
