"""Keep the capture inside its overhead budget while it runs, and say what was given up.

Two costs are watched. The target's: py-spy `--native` ptrace-stops every thread per sample,
and the /proc sampler sees those stops as thread state `t`; the share of thread samples in that
state is the share of the target's time spent stopped. The machine's: CPU used by profkit and
its child tools, read from /proc. Before the capture, the budget is shared out among the costs
that settings control (py-spy's rate and mode, the region probes, the scheduler tracepoints).
During it, a target stopped too much has py-spy restarted --nonblocking (then stopped), and
tools using too much CPU lose the costliest collector.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from ..host import procfs

# py-spy's sampling: --native (stops every thread per sample), --nonblocking (stops none),
# or "auto", which the plan turns into one of the two.
PySpyMode = Literal["auto", "native", "nonblocking"]

TRACED_STATES = (ord("t"), ord("T"))


# py-spy --native stops every thread for each sample, and a synchronised pool loses the whole
# pause. How long one sample holds the target: a cost per thread, and more per thread that can
# run at once, since stopping a thread that runs on another CPU costs more than one that waits;
# fitted to the stop times measured per sample (docs/results/pyspy-cost.md#stops-per-sample).
NATIVE_STOP_S_PER_THREAD = 0.17e-3
NATIVE_STOP_S_PER_RUNNING_THREAD = 0.47e-3
MAX_DEFAULT_RATE_HZ = 10


def native_sample_cost_s(threads: int, cpus: float) -> float:
    """Expected time one --native sample holds the target stopped."""
    threads = max(1, threads)
    running = min(threads, max(1.0, cpus))
    return threads * NATIVE_STOP_S_PER_THREAD + running * NATIVE_STOP_S_PER_RUNNING_THREAD


# py-spy's own CPU per sample per thread of the target, --native several times --nonblocking
# since it unwinds native stacks; from profkit's window CPU with py-spy alone
# (docs/results/pyspy-cost.md#py-spys-own-cpu).
PYSPY_CPU_S_PER_THREAD = {"native": 150e-6, "nonblocking": 30e-6}
# The budget is for the whole capture, so each cost that a setting controls gets a part of it,
# and the parts add up to the whole: py-spy's stops (the largest: a synchronised pool loses the
# whole pause), py-spy's own CPU (on a saturated machine, CPU the target does not get), the
# OpenMP region probes' traps, the scheduler tracepoints, and a part that no setting changes
# (the /proc and cgroup samplers, the native stacks' sampler or perf record at 49 Hz,
# profkit's own loop). Aimed at the whole budget, py-spy alone took it and the default set
# cost more than the budget (docs/results/pyspy-cost.md#what-the-rule-picks); with each
# collector judged against the whole budget, the parts could add up to twice it.
PYSPY_STOP_PART = 0.35
PYSPY_CPU_PART = 0.15
REGION_PROBE_PART = 0.15
SCHED_TRACE_PART = 0.2
FIXED_PART = 0.15
# Without py-spy in the capture (the default where the eBPF walker runs) its parts are not spent,
# and neither is the scheduler's where the scheduler is not traced: the probes keep their own
# part. The walker's default set then aims at 0.3-0.5 of --budget (0.6-1% at the default 2%),
# below the 1% that the eBPF profilers state for a default capture, with room for what the rate
# check's cost per region misses. Given more than their own part, the probes stayed on for
# more of a busy front's window and cost it more than that 1%
# (docs/results/overhead.md#why-the-probes-keep-their-own-part-of-the-budget).


def pyspy_stop_part(probes: bool) -> float:
    """py-spy's part of the budget for its stops. Without the eBPF probes (no bcc, or not
    requested) their parts are free, and the stops may have them: native frames are what
    places the pool's work under its Python call site when no region probe does."""
    return PYSPY_STOP_PART + (0.0 if probes else REGION_PROBE_PART + SCHED_TRACE_PART)


def default_rate(
    threads: int,
    budget: float,
    mode: PySpyMode = "native",
    cpus: float = 1.0,
    stop_part: float = PYSPY_STOP_PART,
) -> int:
    """The py-spy rate whose expected pauses and CPU fit their parts of the budget, 1 to 10 Hz."""
    threads = max(1, threads)
    by_cpu = (
        PYSPY_CPU_PART
        * budget
        * max(1.0, cpus)
        / (threads * PYSPY_CPU_S_PER_THREAD.get(mode, PYSPY_CPU_S_PER_THREAD["native"]))
    )
    fits = by_cpu
    if mode == "native":
        fits = min(fits, stop_part * budget / native_sample_cost_s(threads, cpus))
    return max(1, min(MAX_DEFAULT_RATE_HZ, int(fits)))


# The most a suggested --budget asks for py-spy --native's samples, unless even 1 Hz needs more.
MAX_SUGGESTED_BUDGET = 0.1


def native_budget(threads: int, cpus: float) -> float:
    """The --budget (a fraction, whole half-percents) at which py-spy --native's stops fit their
    part where no eBPF probe runs, at the highest rate up to 10 Hz that MAX_SUGGESTED_BUDGET
    holds (1 Hz where none does): what a capture that could not place the pool without native
    frames would need to place it by py-spy's samples (default_rate then picks that rate)."""
    per_hz = native_sample_cost_s(threads, cpus) / pyspy_stop_part(probes=False)
    rate = max(1, min(MAX_DEFAULT_RATE_HZ, int(MAX_SUGGESTED_BUDGET / per_hz)))
    return math.ceil(per_hz * rate * 200) / 200


def auto_mode(
    threads: int, budget: float, cpus: float, stop_part: float = PYSPY_STOP_PART
) -> tuple[PySpyMode, str]:
    """--native where even its slowest rate (1 Hz) fits the stops' part of the budget, else
    --nonblocking; and why."""
    cost = native_sample_cost_s(threads, cpus)
    if cost <= stop_part * budget:
        return "native", ""
    return "nonblocking", (
        f"--native would hold {threads} threads on {cpus:g} CPUs stopped ~{1000 * cost:.0f} ms "
        f"per sample, {100 * cost:.1f}% of the time at 1 Hz, over the "
        f"{100 * stop_part * budget:.2g}% part of the {100 * budget:g}% budget "
        f"that py-spy's stops may take"
    )


@dataclass(frozen=True)
class Budget:
    # The most of the target's throughput the capture may cost it, 0 to 1 (`--budget` is this
    # in percent). The parts above share it out; py-spy's stops are also watched against it.
    fraction: float = 0.02
    tool_cores: float = 0.5  # CPU of profkit and its tools together
    window_s: float = 3.0  # the tools' CPU is judged over this much of the recent past
    stop_window_s: float = 10.0  # the stops over this much: they are rare events, see below
    settle_s: float = 1.5  # samples this soon after the start or a change are not judged


# A /proc sample catches a py-spy stop only if it lands inside one, and at 5 Hz against a few
# ms of stop every half second most samples miss, so one sample that hits a stop reads as many
# times the true stopped time, and taken at face value it restarted py-spy --nonblocking for nothing
# (docs/results/pyspy-cost.md#judging-the-stops). So the judgement uses the lower bound of a
# 95% Wilson interval over the sample instants (threads stop together, so instants, not thread
# rows, are the independent draws), with at least a few of them.
STOP_CONFIDENCE_Z = 1.96
MIN_STOP_INSTANTS = 5
# Consecutive stopped instants are one stop, not several draws: py-spy --native reads a
# library's symbols the first time a sample lands in it, with the target stopped for a few
# tenths of a second, sometimes mid-window, and the 5-Hz samples inside that one pause would
# read as a long time stopped (docs/results/pyspy-cost.md#judging-the-stops). A single pause
# this long is a cost paid once; one of HANG_S or more is not py-spy sampling any more, and is
# acted on at once.
HANG_S = 1.0
# py-spy goes --nonblocking when the stops show (with that confidence) over this many times the
# whole budget: the default rate is chosen to sit inside its part, and a restart costs
# py-spy's start-up CPU, so only a clear excess is acted on.
STOP_LIMIT = 2.0


def times(factor: float) -> str:
    """A factor in words, for the reasons and the help that quote one."""
    return "twice" if factor == 2 else f"{factor:g} times"


@dataclass(frozen=True)
class StopEstimate:
    stopped: float  # the fraction of the sampled thread time in tracing stop
    lower: float  # the fraction that the samples show with 95% confidence
    instants: int
    longest_s: float = 0.0  # the longest run of stopped instants, first to last


def wilson_lower(hits: float, draws: int, z: float = STOP_CONFIDENCE_Z) -> float:
    """Lower bound of the Wilson score interval for hits out of draws."""
    if draws <= 0:
        return 0.0
    p = hits / draws
    centre = p + z * z / (2 * draws)
    margin = z * math.sqrt(p * (1 - p) / draws + z * z / (4 * draws * draws))
    return max(0.0, (centre - margin) / (1 + z * z / draws))


def _stop_episodes(instants: list[tuple[int, int, int]]) -> tuple[float, float]:
    """Hits for the Wilson bound, one per run of consecutive stopped instants (the run's largest
    stopped fraction), and the longest run's length in seconds."""
    hits, longest_ns, run_stopped, run_start = 0.0, 0, 0.0, None
    for t, total, stopped in [*instants, (0, 1, 0)]:  # a sentinel closes the last run
        if stopped:
            run_start = t if run_start is None else run_start
            run_stopped = max(run_stopped, stopped / total)
            longest_ns = max(longest_ns, t - run_start)
        elif run_start is not None:
            hits, run_stopped, run_start = hits + run_stopped, 0.0, None
    return hits, longest_ns / 1e9


# What the budget can do while capturing: restart py-spy --nonblocking, or stop a collector.
NONBLOCKING = "nonblocking"
DROP = "drop"


@dataclass
class Decision:
    t_ns: int
    action: str  # NONBLOCKING or DROP
    collector: str
    reason: str


@dataclass
class BudgetMonitor:
    budget: Budget
    started_ns: int
    decisions: list[Decision] = field(default_factory=list)
    _cpu: deque[tuple[int, float]] = field(default_factory=deque)
    _last_change_ns: int = 0
    _rows_seen: int = 0
    _stops: deque[tuple[int, int, int]] = field(default_factory=deque)

    def stop_estimate(self, rows: list[tuple[int, ...]], now_ns: int) -> StopEstimate | None:
        """How much of the target's thread time was in tracing stop lately (rows: /proc
        sampler); None until there are enough sample instants to judge."""
        fresh = rows[self._rows_seen :]
        self._rows_seen = len(rows)
        # py-spy holds the target stopped while it attaches; that start-up pause is over by the
        # time the settle period ends, and judging the rate by it would punish every restart.
        since = max(self.started_ns, self._last_change_ns) + int(self.budget.settle_s * 1e9)
        by_time: dict[int, list[int]] = {}
        for row in fresh:
            if row[0] < since:
                continue
            counts = by_time.setdefault(row[0], [0, 0])
            counts[0] += 1
            counts[1] += row[5] in TRACED_STATES
        for t, (total, stopped) in by_time.items():
            self._stops.append((t, total, stopped))
        horizon = now_ns - int(self.budget.stop_window_s * 1e9)
        while self._stops and self._stops[0][0] < horizon:
            self._stops.popleft()
        if len(self._stops) < MIN_STOP_INSTANTS:
            return None
        fraction = sum(s[2] for s in self._stops) / sum(s[1] for s in self._stops)
        hits, longest_s = _stop_episodes(list(self._stops))
        instants = len(self._stops)
        return StopEstimate(fraction, wilson_lower(hits, instants), instants, longest_s)

    def tool_cores(self, pids: list[int], now_ns: int) -> float | None:
        """CPU of profkit itself and its tools over the window, in cores."""
        seconds = 0.0
        for pid in pids:
            try:
                seconds += procfs.read_stat(pid).cpu_seconds
            except (FileNotFoundError, ProcessLookupError):
                continue
        self._cpu.append((now_ns, seconds))
        horizon = now_ns - int(self.budget.window_s * 1e9)
        while len(self._cpu) > 2 and self._cpu[0][0] < horizon:
            self._cpu.popleft()
        (t0, s0), (t1, s1) = self._cpu[0], self._cpu[-1]
        # Tools stopped since the window began make the sum drop: never report below zero.
        return None if t1 - t0 < 1e9 else max(0.0, (s1 - s0) / ((t1 - t0) / 1e9))

    def settled(self, now_ns: int) -> bool:
        since = max(self.started_ns, self._last_change_ns)
        return now_ns - since >= (self.budget.settle_s + 1.5) * 1e9

    def record(self, now_ns: int, action: str, collector: str, reason: str) -> None:
        self.decisions.append(Decision(now_ns, action, collector, reason))
        self._last_change_ns = now_ns
        self._stops.clear()
        self._cpu.clear()
