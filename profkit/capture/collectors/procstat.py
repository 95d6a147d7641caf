"""/proc sampler: the process's CPU and its main thread's state at 5 Hz, every thread's CPU time,
state and context switches once a second.

This is the ground truth for CPU time. utime/stime tick at 1/CLK_TCK; schedstat's run time is
in nanoseconds where the kernel keeps it, and is recorded beside them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re

from ...bundle.parts import PROC, CollectorResult, CollectorStatus
from ...bundle.safefile import write_new
from ...host import procfs
from ...host.target import Target
from .base import Availability, CaptureContext
from .periodic import PeriodicSampler

COLUMNS = ("t_ns", "tid", "utime", "stime", "runtime_ns", "state", "vcsw", "nvcsw", "cpu")
# Every thread's stat is read once a second: the counters are cumulative, so a window's CPU per
# thread needs only its two ends, and the pool's CPU over time is drawn in half-second bins.
# Between those full samples only the process's stat and the main thread's are read, five times
# a second: the process's CPU line, and the stop budget's signal (py-spy --native stops the
# main thread with every sample). Reading every thread at 5 Hz made the sampler the largest
# part of profkit's own CPU on a serving front
# (docs/results/own-cost.md#profkits-own-cpu-in-the-window).
THREAD_INTERVAL_S = 1.0
# Beyond 200 threads the full samples stretch so that profkit reads each file of at most ~200
# threads a second: reading twice as many, the sampler alone cost a busy 64-thread serving
# recipe a share of its requests that showed
# (docs/results/own-cost.md#profkits-own-cpu-in-the-window).
THREAD_READS_PER_S = 200
# Descriptors kept open for re-reading, at most: a target's thread count is its own to choose
# (a thread-per-request server holds thousands), and a descriptor per thread and file ran a
# capture out of its open-file limit. Files past these are opened, read and closed each time.
MAX_KEPT_FILES = 256
# The threads whose schedstat run time and context switches (the cumulative extras) are read
# at the first and last full sample; the rest have -1 there, as between those samples.
MAX_EXTRA_THREADS = 1024


# schedstat's run time and status's context switches are cumulative and only their window
# totals are used, so they are read at the first and the last full sample (-1 in between), and
# the thread list is read again only when the process's thread count changes or a thread's
# file is gone: on a large front each of those is a pass over every thread, a CPU cost of its
# own (docs/results/2core-proc-sampler-lean.txt).
_SWITCHES = re.compile(r"^(voluntary|nonvoluntary)_ctxt_switches:\s*(\d+)", re.MULTILINE)


def parse_switches(text: str) -> tuple[int, int]:
    """Voluntary and involuntary context switches from a status file's text."""
    found = dict(_SWITCHES.findall(text))
    return int(found.get("voluntary", -1)), int(found.get("nonvoluntary", -1))


class ProcCollector:
    name = "proc"

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.thread_interval_s = THREAD_INTERVAL_S
        self.rows: list[tuple[int, ...]] = []
        self.process_rows: list[tuple[int, int, int]] = []
        self.full_t_ns: list[int] = []  # the samples at which every thread was read
        self.names: dict[int, str] = {}
        self._context: CaptureContext | None = None
        self._sampler: PeriodicSampler | None = None
        self._full_every = 1
        self._schedstat = True
        self._tids: list[int] = []
        self._relist = True
        self._fds: dict[tuple[int | None, str], int] = {}
        self._extras: set[int] = set()  # the threads whose extras are read

    def available(self, target: Target) -> Availability:
        if os.access(procfs.task_dir(target.pid) / "task", os.R_OK):
            return Availability(True)
        return Availability(False, f"/proc/{target.pid}/task is not readable")

    def start(self, context: CaptureContext) -> None:
        self._context = context
        self.thread_interval_s = max(THREAD_INTERVAL_S, context.target.threads / THREAD_READS_PER_S)
        self._full_every = max(1, round(self.thread_interval_s / self.interval_s))
        self._sampler = PeriodicSampler(self.name, self.interval_s, self._sample, context.clock)
        self._sampler.start()

    def _sample(self, now_ns: int, full: bool | None = None, last: bool = False) -> bool:
        assert self._context is not None
        pid = self._context.target.pid
        if full is None:
            full = len(self.process_rows) % self._full_every == 0
        ends = full and (last or not self.full_t_ns)  # read the cumulative extras
        try:
            process = procfs.parse_stat(self._read(pid, None, "stat"))
            if full and (self._relist or process.num_threads != len(self._tids)):
                self._tids, self._relist = procfs.list_tids(pid), False
                self._forget_exited(set(self._tids))
        except (FileNotFoundError, ProcessLookupError):
            return False  # the target exited
        self.process_rows.append((now_ns, process.utime_ticks, process.stime_ticks))
        for tid in self._tids if full else [pid]:
            # The cumulative extras, for at most MAX_EXTRA_THREADS threads: two more files
            # for each of thousands of threads were most of a capture's start and end.
            extras = ends and (tid in self._extras or len(self._extras) < MAX_EXTRA_THREADS)
            try:
                text = self._read(pid, tid, "stat")
                state, utime, stime, cpu = procfs.stat_counters(text)
                runtime_ns = self._runtime(pid, tid) if extras and self._schedstat else -1
                vcsw, nvcsw = parse_switches(self._read(pid, tid, "status")) if extras else (-1, -1)
                if extras:
                    self._extras.add(tid)
            except (FileNotFoundError, ProcessLookupError):
                self._relist = True
                continue  # the thread exited between listing and reading
            if runtime_ns == 0 and tid == pid:
                self._schedstat = False  # the kernel does not keep it: stop reading it
            if tid not in self.names:
                self.names[tid] = procfs.parse_stat(text).comm
            self.rows.append(
                (now_ns, tid, utime, stime, runtime_ns, ord(state[0]), vcsw, nvcsw, cpu)
            )
        if full:
            self.full_t_ns.append(now_ns)
        return True

    def _read(self, pid: int, tid: int | None, name: str) -> str:
        """A /proc file of the process (tid None) or of one thread, through a descriptor kept
        open: re-reading an open /proc file gives fresh values, and skipping an open, a close
        and a path per thread per sample is CPU the target keeps (this sampler was most of
        profkit's own CPU in a window). At most MAX_KEPT_FILES are kept; the rest are opened
        for each read."""
        key = (tid, name)
        fd = self._fds.get(key)
        kept = fd is not None
        if fd is None:
            fd = os.open(f"{procfs.task_dir(pid, tid)}/{name}", os.O_RDONLY | os.O_CLOEXEC)
            kept = len(self._fds) < MAX_KEPT_FILES
            if kept:
                self._fds[key] = fd
        try:
            text = os.pread(fd, 4096, 0).decode(errors="replace")
        except OSError as exc:
            text = ""
            error: OSError | None = exc
        else:
            error = None
        if not kept or not text:
            self._fds.pop(key, None)
            os.close(fd)
        if not text:
            raise FileNotFoundError(f"thread {tid} is gone") from error
        return text

    def _forget_exited(self, alive: set[int]) -> None:
        """Close the files of threads that exited (a target that starts and ends threads all the
        time would otherwise pile up descriptors; schedstat and status stay open between the
        first and the last full sample)."""
        for key in [k for k in self._fds if k[0] is not None and k[0] not in alive]:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop(key))

    def _runtime(self, pid: int, tid: int) -> int:
        try:
            return int(self._read(pid, tid, "schedstat").split()[0])
        except (ValueError, IndexError):
            return -1

    def _close_files(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def progress(self) -> int:
        return len(self.process_rows)

    def latest_cores(self) -> float | None:
        """Process CPU in cores over the last second of samples, for the live display."""
        rows = self.process_rows[-11:]
        if len(rows) < 2 or rows[-1][0] == rows[0][0]:
            return None
        ticks = (rows[-1][1] + rows[-1][2]) - (rows[0][1] + rows[0][2])
        return ticks / procfs.CLOCK_TICKS / ((rows[-1][0] - rows[0][0]) / 1e9)

    def stop(self) -> CollectorResult:
        assert self._sampler is not None and self._context is not None
        self._sampler.stop()
        if not self._sampler.exhausted and self._sampler.error is None:
            # One last full sample, so that the threads' CPU reaches the end of the window.
            with contextlib.suppress(OSError):
                self._sample(self._context.clock(), full=True, last=True)
        self._close_files()
        columns = {name: [row[i] for row in self.rows] for i, name in enumerate(COLUMNS)}
        payload = {
            "clock_ticks": procfs.CLOCK_TICKS,
            "interval_s": self.interval_s,
            "thread_interval_s": self.thread_interval_s,
            "full_t_ns": self.full_t_ns,
            "threads": {str(tid): name for tid, name in self.names.items()},
            "process": {
                "t_ns": [r[0] for r in self.process_rows],
                "utime": [r[1] for r in self.process_rows],
                "stime": [r[2] for r in self.process_rows],
            },
            "samples": columns,
        }
        write_new(self._context.directory / PROC, json.dumps(payload))
        error = self._sampler.error
        status: CollectorStatus = "failed" if error else "ok"
        return CollectorResult(
            self.name,
            status,
            reason=repr(error) if error else "",
            samples=len(self.process_rows),
            start_ns=self.process_rows[0][0] if self.process_rows else None,
            end_ns=self.process_rows[-1][0] if self.process_rows else None,
            files=(PROC,),
            notes={
                "threads_seen": len(self.names),
                "target_exited": self._sampler.exhausted,
                "extras_threads": len(self._extras),
            },
        )
