"""CPU ground truth over the capture window, from the /proc samples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bundle.read import ProcSeries


@dataclass(frozen=True)
class ThreadCpu:
    tid: int
    name: str
    cpu_seconds: float


@dataclass(frozen=True)
class CpuWindow:
    start_ns: int
    end_ns: int
    process_cpu_seconds: float
    threads: tuple[ThreadCpu, ...]

    @property
    def seconds(self) -> float:
        return max(1e-9, (self.end_ns - self.start_ns) / 1e9)

    @property
    def process_cores(self) -> float:
        return self.process_cpu_seconds / self.seconds

    def cores(self, tid: int) -> float:
        return next((t.cpu_seconds for t in self.threads if t.tid == tid), 0.0) / self.seconds

    def cores_of(self, tids: set[int] | frozenset[int]) -> float:
        return sum(t.cpu_seconds for t in self.threads if t.tid in tids) / self.seconds


def _nearest(times: np.ndarray, t: int) -> int:
    return int(np.argmin(np.abs(times - t)))


def cpu_window(proc: ProcSeries, window: tuple[int, int]) -> CpuWindow:
    """Per-thread and process CPU between the full /proc samples (every thread read) nearest
    the window's ends."""
    times = proc.full_t_ns[np.isin(proc.full_t_ns, proc.process_t_ns)]
    if len(times) < 2:
        return CpuWindow(window[0], window[1], 0.0, ())
    first = int(times[_nearest(times, window[0])])
    last = int(times[_nearest(times, window[1])])
    if last <= first:
        first, last = int(times[0]), int(times[-1])
    ticks = proc.clock_ticks
    process_first = proc.process_ticks[proc.process_t_ns == first][0]
    process_last = proc.process_ticks[proc.process_t_ns == last][0]
    rows = np.flatnonzero((proc.t_ns >= first) & (proc.t_ns <= last))
    # Each thread's rows together, in time order: its first and last row in the window, in one
    # pass however many threads the target holds.
    rows = rows[np.lexsort((proc.t_ns[rows], proc.tid[rows]))]
    tids, starts, counts = np.unique(proc.tid[rows], return_index=True, return_counts=True)
    t_rows, values = proc.t_ns[rows], proc.cpu_ticks[rows]
    # A thread born inside the window started from zero; one that exited keeps its last value.
    start_values = np.where(t_rows[starts] == first, values[starts], 0)
    seconds = (values[starts + counts - 1] - start_values) / ticks
    threads = tuple(
        ThreadCpu(int(tid), proc.names.get(int(tid), "?"), float(cpu))
        for tid, cpu in zip(tids, seconds, strict=True)
    )
    return CpuWindow(first, last, float(process_last - process_first) / ticks, threads)
