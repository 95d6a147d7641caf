"""One clock for everything in a bundle: CLOCK_MONOTONIC in nanoseconds.

perf records with `-k CLOCK_MONOTONIC`, bpf_ktime_get_ns() is the same clock, and the /proc and
cgroup samplers read time.monotonic_ns(). Only py-spy keeps time relative to its own start; its
events are shifted by the anchor the py-spy collector records.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def monotonic_ns() -> int:
    return time.monotonic_ns()


NS_PER_S = 1_000_000_000
