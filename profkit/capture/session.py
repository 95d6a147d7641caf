"""Run the collectors side by side on one clock and save a session bundle.

capture() holds what must outlive any failure (the target's lock, the bundle directory, the
record of this capture in progress) and drives a Session through three steps: open (first
manifest, collectors started), run (the window, kept inside the budget) and close (collectors
stopped, the bundle bounded, the final manifest). Whatever fails on the way, Session.abort
stops what still runs and marks the bundle aborted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeVar

from ..bundle.parts import MANIFEST, OWNER, PERF_DATA, CaptureStatus, CollectorResult
from ..bundle.safefile import held_directory
from ..bundle.write import (
    collector_record,
    create_directory,
    finish_within,
    new_manifest,
    target_record,
    torch_version_of,
    write_manifest,
)
from ..errors import (
    CaptureFailed,
    CgroupError,
    NoSuchProcess,
    OutputError,
    ProfkitError,
    UsageError,
)
from ..host import procfs
from ..host.cgroup import cpu_cgroup
from ..host.pythreads import python_thread_names
from ..host.quota import diagnose
from ..host.target import Target, ensure_same, pool_threads
from .budget import DROP, HANG_S, NONBLOCKING, STOP_LIMIT, BudgetMonitor, Decision, times
from .clock import NS_PER_S, Clock, monotonic_ns
from .collectors.base import CaptureContext, CaptureOptions, Collector
from .collectors.cgroupstat import CgroupCollector
from .collectors.procstat import ProcCollector
from .collectors.pyspy import PySpyCollector
from .ebpf.collector import EbpfCollector
from .registry import ALL_COLLECTORS, REGISTRY
from .runs import RunRecord, target_lock
from .signals import interruptible, stop_on_signals, teardown_shielded
from .startup import (
    cpu_spent_by_tool,
    tools_cpu_by_process,
    tools_cpu_seconds,
    wait_for_tools_to_settle,
    wait_until_attached,
)

# Teardown: the samplers first, so that their last samples close the window (the /proc
# sampler's last full one is each thread's CPU at the end); then the tools all at once, since
# one after the other their stops add up, most of each one a tool writing out or profkit
# reading what it wrote (docs/results/own-cost.md#teardown).
SAMPLERS = ("proc", "cgroup")
# Which collector goes first when the tools use too much CPU, costliest kind first.
DROP_ORDER = ("perf_record", "pyspy", "perf_stat", "ebpf")
# A write that failed for one of these ends the capture: the disk, not a collector, is at fault.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)

C = TypeVar("C")


@dataclass
class CaptureRequest:
    target: Target
    directory: Path
    duration_s: float
    rate_hz: int
    collectors: tuple[str, ...]
    max_size_mb: float = 256.0
    options: CaptureOptions = field(default_factory=CaptureOptions)
    clock: Clock = monotonic_ns
    # Run even if another profkit is capturing the same target; both manifests say so.
    force: bool = False
    # Requested collectors this user may not run, and why: recorded, never started.
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Progress:
    """What the live display shows, at each look at the target during the window."""

    elapsed_s: float
    cores: float | None  # the target's CPU over the last second
    throttled_pct: float | None  # of its cgroup's periods, lately
    samples: dict[str, int]  # so far, of the collectors that count as they go


@dataclass(frozen=True)
class Window:
    """How the window went, from Session.run to Session.close."""

    status: CaptureStatus
    reason: str
    start_ns: int
    end_ns: int
    settle_s: float
    attach_stop_s: float | None
    tools_cpu_start: dict[str, float]  # tools_cpu_by_process as the window opened
    tools_cpu: dict[str, float]  # by tool, while it was open
    decisions: list[Decision]  # what was given up to keep the budget
    # Ended by Ctrl-C or SIGTERM: someone is waiting, and the tools are stopped in a hurry.
    interrupted: bool = False


def target_state(target: Target) -> Literal["target exited", "target exec'd"] | None:
    """None while the target is the process that was inspected; else why it is not."""
    try:
        now = procfs.read_image(target.pid)
    except (FileNotFoundError, ProcessLookupError):
        return "target exited"
    except OSError:
        return None
    if now.start_ticks != target.start_ticks:
        return "target exited"
    if target.image is not None and not now.same_program_run(target.image):
        return "target exec'd"
    return None


def capture(
    request: CaptureRequest,
    stop: threading.Event | None = None,
    on_tick: Callable[[Progress], None] | None = None,
) -> dict:
    """Capture into request.directory and return the manifest that was written.

    Whatever ends it early (an error, a failed write, an exception no one expected), the tools
    are stopped, perf.data is removed and the bundle is marked aborted with the reason before
    the error goes on to the command line.
    """
    if not math.isfinite(request.duration_s) or request.duration_s <= 0:
        raise UsageError(f"--duration must be a positive number, got {request.duration_s:g}")
    if request.rate_hz <= 0 or request.rate_hz > 1000:
        raise UsageError(f"--rate must be between 1 and 1000 Hz, got {request.rate_hz}")
    ensure_same(request.target)
    target = request.target
    old_umask = os.umask(0o077)
    try:
        where = request.directory.absolute()
        with target_lock(target.pid, target.start_ticks, where, request.force) as overlaps:
            fd = create_directory(request.directory)
            try:
                with (
                    interruptible(),
                    RunRecord(target.pid, target.start_ticks, where, fd) as record,
                ):
                    session = Session(request, held_directory(fd), record, overlaps)
                    try:
                        session.open()
                        return session.close(session.run(stop or threading.Event(), on_tick))
                    except BaseException as exc:
                        record.keep = not session.abort(exc)
                        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
                            raise OutputError(
                                f"cannot write {request.directory}: {exc.strerror}; the capture "
                                "was aborted"
                            ) from exc
                        if isinstance(exc, OutputError):
                            # Its message names the file; the bundle is said here.
                            raise OutputError(
                                f"{exc.format_message()} (bundle {request.directory})"
                            ) from exc
                        raise
            finally:
                os.close(fd)
    finally:
        os.umask(old_umask)


class Session:
    """One capture's state, which each step adds to and abort() cleans up after."""

    def __init__(
        self,
        request: CaptureRequest,
        directory: Path,
        record: RunRecord,
        overlaps: list[dict[str, object]],
    ) -> None:
        self.request = request
        self.directory = directory  # the held bundle directory
        self.record = record
        self.overlaps = overlaps  # captures of the same target found when the lock was taken
        self.manifest: dict[str, object] | None = None  # once written
        self.results: dict[str, CollectorResult] = {}
        self.running: dict[str, Collector] = {}
        self.dropped: dict[str, str] = {}  # collectors given up to keep the budget, and why
        self.tools_cpu_before = 0.0

    def open(self) -> None:
        """Write the first manifest (what is captured, and how), then start the collectors."""
        request, target = self.request, self.request.target
        names = procfs.thread_names(target.pid)
        python_names = python_thread_names(target.pid)[0] if target.is_python else {}
        manifest = new_manifest(
            target_record(target, names, torch_version_of(target), python_names),
            _quota(target),
            _options_record(request),
        )
        if self.overlaps:
            manifest["overlapped_with"] = self.overlaps
        write_manifest(self.directory, manifest)
        self.manifest = manifest
        context = CaptureContext(
            target,
            self.directory,
            request.rate_hz,
            request.duration_s,
            request.clock,
            request.options,
            self.record.add_child,
            request.collectors,
        )
        self.tools_cpu_before = tools_cpu_seconds(self.record)
        self._start_collectors(context)
        if not self.running:
            gone = target_state(target)
            if gone is not None:
                # The bundle is marked aborted with each reason, as for any failed start.
                raise NoSuchProcess(f"pid {target.pid}: {gone} while the collectors started")
            raise CaptureFailed(
                "no collector could start: "
                + "; ".join(f"{n}: {r.reason}" for n, r in self.results.items())
            )

    def _start_collectors(self, context: CaptureContext) -> None:
        request = self.request
        for name in ALL_COLLECTORS:
            if name not in request.collectors:
                self.results[name] = CollectorResult(
                    name, "skipped", "not in this capture's set (--collectors adds it)"
                )
                continue
            if name in request.unavailable:
                self.results[name] = CollectorResult(name, "unavailable", request.unavailable[name])
                continue
            collector = REGISTRY[name]()
            availability = collector.available(request.target)
            if not availability.ok:
                self.results[name] = CollectorResult(name, "unavailable", availability.reason)
                continue
            try:
                collector.start(context)
            except Exception as exc:  # one broken collector must not stop the others
                # A target that went meanwhile fails every reader of its files: say that.
                why = target_state(request.target) or f"start failed: {exc}"
                self.results[name] = CollectorResult(name, "failed", why[:300])
                continue
            self.running[name] = collector

    def run(self, stop: threading.Event, on_tick: Callable[[Progress], None] | None) -> Window:
        """Wait for the tools to finish starting, then hold the window open for the duration,
        or until the target goes or a signal (stop) comes."""
        request, clock = self.request, self.request.clock
        with stop_on_signals(stop) as received:
            # A Ctrl-C while the tools start ends the waits too; the window is then empty.
            attach_stop_s = None
            if "pyspy" in self.running and request.options.pyspy_mode != "nonblocking":
                attach_stop_s = wait_until_attached(request.target, clock, stop)
            settle_s = wait_for_tools_to_settle(self.record, clock, stop)
            ebpf = self._running("ebpf", EbpfCollector)
            if ebpf is not None:
                ebpf.wait_started(stop)
            status: CaptureStatus = "complete"
            reason = ""
            start = clock()
            tools_cpu_start = tools_cpu_by_process(self.record)
            monitor = BudgetMonitor(request.options.budget, start)
            deadline = start + int(request.duration_s * NS_PER_S)
            next_check = start + NS_PER_S
            while clock() < deadline and not stop.is_set():
                # Every wake-up of profkit is CPU the target may need: twice a second is enough
                # to see the target exit and to refresh the terminal line; a signal ends the wait.
                stop.wait(min(0.5, max(0.0, (deadline - clock()) / NS_PER_S)))
                gone = target_state(request.target)
                if gone:
                    status, reason = gone, f"the {gone} during the capture"
                    break
                now = clock()
                if now >= next_check:
                    next_check = now + NS_PER_S
                    self._keep_to_budget(monitor, now)
                if on_tick:
                    on_tick(self._progress((now - start) / NS_PER_S))
            if stop.is_set():
                status = "partial"
                reason = f"stopped early by {received[0]}" if received else "stopped early"
        end = clock()
        tools_cpu = cpu_spent_by_tool(tools_cpu_start, tools_cpu_by_process(self.record))
        return Window(
            status,
            reason,
            start,
            end,
            settle_s,
            attach_stop_s,
            tools_cpu_start,
            tools_cpu,
            monitor.decisions,
            interrupted=stop.is_set(),
        )

    def _running(self, name: str, kind: type[C]) -> C | None:
        """The running collector of that name, as its own class, for what only it can do."""
        collector = self.running.get(name)
        return collector if isinstance(collector, kind) else None

    def _progress(self, elapsed_s: float) -> Progress:
        proc = self._running("proc", ProcCollector)
        cgroup = self._running("cgroup", CgroupCollector)
        counts = {name: c.progress() for name, c in self.running.items()}
        return Progress(
            elapsed_s,
            proc.latest_cores() if proc is not None else None,
            cgroup.latest_throttled_pct() if cgroup is not None else None,
            {name: count for name, count in counts.items() if count},
        )

    def _keep_to_budget(self, monitor: BudgetMonitor, now: int) -> None:
        """Once a second: py-spy goes --nonblocking (or stops) when the target is stopped too
        much, and a collector is stopped when the tools use too much CPU."""
        clock = self.request.clock
        proc = self._running("proc", ProcCollector)
        stops = monitor.stop_estimate(proc.rows, now) if proc is not None else None
        children = [child.pid for child in self.record.children]
        cores = monitor.tool_cores([os.getpid(), *children], now)
        if not monitor.settled(now):
            return
        pyspy = self._running("pyspy", PySpyCollector)
        if (
            stops is not None
            and pyspy is not None
            and "pyspy" not in self.dropped
            and (stops.lower > STOP_LIMIT * monitor.budget.fraction or stops.longest_s >= HANG_S)
        ):
            why = (
                f"target stopped {100 * stops.stopped:.1f}% of the time by py-spy (at least "
                f"{100 * stops.lower:.1f}% with 95% confidence over {stops.instants} samples), "
                f"over {times(STOP_LIMIT)} the {100 * monitor.budget.fraction:g}% budget"
                if stops.longest_s < HANG_S
                else f"py-spy held the target stopped for {stops.longest_s:.1f} s at once"
            )
            still = pyspy.back_off(why, now)
            monitor.record(clock(), NONBLOCKING if still else DROP, "pyspy", why)
            if not still:
                self.dropped["pyspy"] = why
            return
        if cores is not None and cores > monitor.budget.tool_cores:
            for name in DROP_ORDER:
                if name in self.running and name not in self.dropped and name != "proc":
                    why = (
                        f"profkit's tools used {cores:.2f} cores, over the "
                        f"{monitor.budget.tool_cores:g}-core budget"
                    )
                    result = self.running.pop(name).stop()
                    self.results[name] = replace(result, status="partial", reason=why)
                    self.dropped[name] = why
                    monitor.record(now, DROP, name, why)
                    return

    def close(self, window: Window) -> dict:
        """Stop the collectors, keep the bundle under its size bound and write the final
        manifest, which is returned."""
        request, results = self.request, self.results
        with teardown_shielded():
            stop_seconds = self._stop_all(hurry=window.interrupted)
        for name, why in self.dropped.items():
            if name in results:
                results[name] = replace(results[name], status="partial", reason=why)
        max_bytes = int(request.max_size_mb * 1024 * 1024)

        def manifest_for(degraded: list[str]) -> dict:
            for name in degraded:
                owner = OWNER.get(name)
                if owner in results and results[owner].status == "ok":
                    results[owner] = replace(
                        results[owner],
                        status="partial",
                        reason=f"{name} dropped to keep the bundle under --max-size",
                    )
            return self._final_manifest(window, stop_seconds, degraded)

        return finish_within(self.directory, max_bytes, manifest_for)

    def _final_manifest(
        self, window: Window, stop_seconds: dict[str, float], degraded: list[str]
    ) -> dict:
        request, results = self.request, self.results
        assert self.manifest is not None  # written by open()
        manifest = self.manifest
        manifest.update(
            {
                "status": window.status,
                "status_reason": window.reason,
                "window": {
                    "start_ns": window.start_ns,
                    "end_ns": window.end_ns,
                    "requested_s": request.duration_s,
                    # What profkit and its tools spent while the window was open: on a
                    # saturated machine this is CPU the target did not get.
                    "tools_cpu_s": round(sum(window.tools_cpu.values()), 4),
                    "tools_cpu_by_tool_s": window.tools_cpu,
                },
                "collectors": {
                    n: collector_record(results[n]) for n in ALL_COLLECTORS if n in results
                },
                "startup": {
                    "tools_cpu_s": round(
                        sum(window.tools_cpu_start.values()) - self.tools_cpu_before, 3
                    ),
                    "settle_s": round(window.settle_s, 3),
                    # py-spy --native's long attach stop that the window waited out (None: none
                    # was seen before the timeout, and it may come inside the window).
                    "pyspy_attach_stop_s": (
                        None if window.attach_stop_s is None else round(window.attach_stop_s, 3)
                    ),
                },
                # How long each collector took to stop and write its part, after the window.
                "teardown_s": stop_seconds,
                "budget_decisions": [vars(d) for d in window.decisions],
                "dropped_for_size": list(degraded),
            }
        )
        overlaps = [*self.overlaps, *self.record.overlaps()]
        if overlaps:
            manifest["overlapped_with"] = overlaps
        return manifest

    def _stop_all(self, hurry: bool = False) -> dict[str, float]:
        """Stop every running collector (samplers first, then the tools in parallel); how long
        each took. hurry (Ctrl-C or SIGTERM): py-spy, which notices SIGINT only at its next
        sample, is killed after a short grace rather than waited for."""
        running, results, clock = self.running, self.results, self.request.clock
        pyspy = self._running("pyspy", PySpyCollector)
        if hurry and pyspy is not None:
            pyspy.hurry()
        seconds: dict[str, float] = {}
        full: list[OSError] = []

        def stop_one(name: str) -> None:
            began = clock()
            try:
                results[name] = running.pop(name).stop()
            except Exception as exc:  # one broken collector must not keep the others running
                results[name] = CollectorResult(name, "failed", f"stop failed: {exc}"[:300])
                if isinstance(exc, OSError) and exc.errno in DISK_FULL:
                    full.append(exc)
            seconds[name] = round((clock() - began) / NS_PER_S, 3)

        for name in SAMPLERS:
            if name in running:
                stop_one(name)
        tools = [
            threading.Thread(target=stop_one, args=(name,), name=f"profkit-stop-{name}")
            for name in running
            if name not in SAMPLERS
        ]
        for thread in tools:
            thread.start()
        for thread in tools:
            thread.join()
        if full:
            raise full[0]
        return seconds

    def abort(self, exc: BaseException) -> bool:
        """Stop what still runs, remove perf.data and mark the bundle aborted with what ended
        it; False when the mark could not be written (the run record then stays for the next
        run to mark it)."""
        with teardown_shielded():
            with contextlib.suppress(Exception):
                self._stop_all(hurry=isinstance(exc, KeyboardInterrupt))
            # It holds every process's samples; it never outlives a capture that did not finish.
            with contextlib.suppress(OSError):
                (self.directory / PERF_DATA).unlink()
            manifest = self.manifest
            if manifest is None:
                return True
            manifest["status"] = "aborted"
            manifest["status_reason"] = _abort_reason(exc)
            manifest["collectors"] = {
                n: collector_record(self.results[n]) for n in ALL_COLLECTORS if n in self.results
            }
            try:
                write_manifest(self.directory, manifest)
            except OutputError:
                # On a full disk there may be no room for a second copy: rewrite it in place,
                # compact, into the blocks the old one frees.
                try:
                    fd = os.open(
                        self.directory / MANIFEST, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW
                    )
                    with os.fdopen(fd, "w") as handle:
                        handle.write(json.dumps(manifest, separators=(",", ":")))
                except OSError:
                    return False
        return True


def _abort_reason(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, ProfkitError):
        return exc.format_message()
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return f"a write failed: {exc.strerror}"
    return f"internal error: {type(exc).__name__}: {exc}"[:300]


def _options_record(request: CaptureRequest) -> dict[str, object]:
    """The options in the manifest, each under the name and unit it has in CaptureOptions."""
    options, budget = request.options, request.options.budget
    return {
        "duration_s": request.duration_s,
        "rate_hz": request.rate_hz,
        "collectors": list(request.collectors),
        "max_size_mb": request.max_size_mb,
        "budget": {"fraction": budget.fraction, "tool_cores": budget.tool_cores},
        "perf_callgraph": options.perf_callgraph,
        "perf_rate_hz": options.perf_rate_hz,
        "perf_scope": options.perf_scope,
        "pyspy_mode": options.pyspy_mode,
        "pyspy_mode_reason": options.pyspy_mode_reason,
        "pyspy_native_budget": options.pyspy_native_budget,
        "ebpf_sched": options.ebpf_sched,
        "ebpf_loader": options.ebpf_loader,
        "python_stacks": options.python_stacks,
    }


def _quota(target: Target) -> dict[str, object] | None:
    try:
        cg = cpu_cgroup(target.pid)
    except CgroupError:
        return None
    pool, source = pool_threads(target)
    return diagnose(cg, None, target.cpus_allowed, pool, source).as_dict()
