"""Per-thread CPU over a window when only some /proc samples read every thread."""

from __future__ import annotations

import numpy as np
import pytest

from profkit.analysis.cpu import cpu_window
from profkit.bundle.read import ProcSeries

S = 1_000_000_000
MAIN, WORKER = 100, 101


def split_series() -> ProcSeries:
    """A main thread read at 5 Hz, a worker only at the full samples (every second), 0-3 s.
    The main thread uses 0.5 cores and the worker 1 core, in ticks of 1/100 s."""
    process_times = np.arange(0, 3 * S + 1, S // 5)
    full = np.arange(0, 3 * S + 1, S)
    t, tid, ticks = [], [], []
    for when in process_times:
        t.append(when)
        tid.append(MAIN)
        ticks.append(50 * when // S)
        if when in full:
            t.append(when)
            tid.append(WORKER)
            ticks.append(100 * when // S)
    return ProcSeries(
        clock_ticks=100,
        names={MAIN: "python", WORKER: "worker"},
        t_ns=np.array(t),
        tid=np.array(tid),
        cpu_ticks=np.array(ticks),
        process_t_ns=process_times,
        process_ticks=150 * process_times // S,
        full_t_ns=full,
    )


def test_the_window_ends_on_full_samples() -> None:
    window = cpu_window(split_series(), (int(0.4 * S), int(2.2 * S)))
    # Nearest full samples: 0 s and 2 s, not the 5-Hz samples at 0.4 s and 2.2 s, where the
    # worker was not read and would look as if it had started from zero.
    assert (window.start_ns, window.end_ns) == (0, 2 * S)
    assert window.process_cores == pytest.approx(1.5)
    assert window.cores(MAIN) == pytest.approx(0.5)
    assert window.cores(WORKER) == pytest.approx(1.0)
    assert window.cores_of({MAIN, WORKER}) == pytest.approx(window.process_cores)
