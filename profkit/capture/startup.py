"""Open the window once the tools have finished starting, and say what starting cost.

Starting is the costly part of several tools: py-spy --native holds the target stopped while it
reads libtorch's symbols, perf record reads the maps of every process on the machine (its CPU
is in that start, next to none after it: docs/results/perf-cost.md#start-up), bcc compiles its
programs. A window opened before they are done would judge the sampling by the start-up; the
start-up's own CPU goes to the manifest instead (`startup.tools_cpu_s`).
"""

from __future__ import annotations

import contextlib
import os
import threading

from ..host import procfs
from ..host.target import Target
from .clock import NS_PER_S, Clock
from .runs import RunRecord

# Settled: profkit and its tools together used less than this over the last poll interval.
# Well above what the /proc sampler alone uses on a large pool, so that the samplers never keep
# the window from opening (docs/results/own-cost.md#profkits-own-cpu-in-the-window).
SETTLED_CORES = 0.05
SETTLE_POLL_S = 0.2  # /proc counts CPU in 10-ms ticks: one tick here is 0.05 cores
SETTLE_TIMEOUT_S = 3.0


def _stopped_threads(target: Target) -> int:
    stopped = 0
    for tid in procfs.list_tids(target.pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            stopped += procfs.read_stat(target.pid, tid).state in ("t", "T")
    return stopped


# py-spy's symbol read is the long stop, some tenths of a second. A shorter one can come first,
# and a window opened after that one had the read inside it, with py-spy's CPU
# (docs/results/pyspy-cost.md#the-attach-stop): a stop counts as the read from this length on.
LONG_STOP_S = 0.15
# The first py-spy run on a fresh machine can read the symbols seconds after it starts: a window
# opened at a 3-s timeout had that pause inside it (docs/results/pyspy-cost.md#the-attach-stop).
ATTACH_TIMEOUT_S = 6.0


def wait_until_attached(
    target: Target,
    clock: Clock,
    stop: threading.Event,
    timeout_s: float = ATTACH_TIMEOUT_S,
) -> float | None:
    """Start the window once py-spy's attach pause is over, so that the window measures
    sampling and not attaching. A --native attach holds the target stopped once for far longer
    than a sample does, while py-spy reads libtorch's symbols
    (docs/results/pyspy-cost.md#the-attach-stop), before or after a few shorter stops. So the
    window waits for a stop that lasted at least LONG_STOP_S to end and then for 50 ms without
    one; a target small enough to be read faster simply waits out the timeout, and a Ctrl-C
    (stop) ends the wait. The long stop's length, or None."""
    begin = clock()
    stopped_since: int | None = None
    long_stop_over_at: int | None = None
    long_stop_ns = 0
    while (now := clock()) - begin < timeout_s * NS_PER_S and not stop.is_set():
        try:
            stopped = _stopped_threads(target)
        except FileNotFoundError:
            return None
        if stopped:
            stopped_since = stopped_since or now
        else:
            if stopped_since is not None and now - stopped_since >= LONG_STOP_S * NS_PER_S:
                long_stop_over_at, long_stop_ns = now, now - stopped_since
            stopped_since = None
            if long_stop_over_at is not None and now - long_stop_over_at >= 0.05 * NS_PER_S:
                return long_stop_ns / NS_PER_S
        stop.wait(0.005)
    return None


def tools_cpu_by_process(record: RunRecord) -> dict[str, float]:
    """CPU used so far by profkit (with its reaped children) and by each live child tool,
    keyed "profkit" and "NAME:PID"."""
    times = os.times()
    by_process = {
        "profkit": times.user + times.system + times.children_user + times.children_system
    }
    for child in record.children:
        with contextlib.suppress(OSError, ValueError):
            stat = procfs.read_stat(child.pid)
            if stat.start_ticks == child.start:  # not a reaped child's reused pid
                by_process[f"{stat.comm}:{child.pid}"] = stat.cpu_seconds
    return by_process


def tools_cpu_seconds(record: RunRecord) -> float:
    """CPU used so far by profkit and its child tools, live and already reaped."""
    return sum(tools_cpu_by_process(record).values())


def cpu_spent_by_tool(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each tool's CPU between two readings of tools_cpu_by_process, by tool name. A tool
    reaped in between (a restarted py-spy) has its whole CPU in profkit's children's times by
    then, so what it had at the first reading is taken back out of profkit's; what it used
    after that stays under profkit."""
    spent: dict[str, float] = {}
    for key, seconds in after.items():
        name = key.rsplit(":", 1)[0]
        spent[name] = spent.get(name, 0.0) + seconds - before.get(key, 0.0)
    spent["profkit"] -= sum(seconds for key, seconds in before.items() if key not in after)
    return {name: round(max(0.0, seconds), 4) for name, seconds in spent.items()}


def wait_for_tools_to_settle(
    record: RunRecord,
    clock: Clock,
    stop: threading.Event,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> float:
    """Wait until the tools' start-up CPU has died down, or a Ctrl-C; the seconds waited."""
    begin = clock()
    last_cpu, last_t = tools_cpu_seconds(record), begin
    while (now := clock()) - begin < timeout_s * NS_PER_S and not stop.is_set():
        stop.wait(SETTLE_POLL_S)
        cpu, now = tools_cpu_seconds(record), clock()
        if (cpu - last_cpu) / max(1e-9, (now - last_t) / NS_PER_S) <= SETTLED_CORES:
            break
        last_cpu, last_t = cpu, now
    return (clock() - begin) / NS_PER_S
