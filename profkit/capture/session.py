"""Run the collectors side by side on one clock and save a session bundle."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..bundle.parts import MANIFEST, OWNER, PERF_DATA, CollectorResult
from ..bundle.safefile import held_directory
from ..bundle.write import (
    collector_record,
    create_directory,
    enforce_max_size,
    new_manifest,
    target_record,
    torch_version_of,
    write_manifest,
)
from ..errors import CaptureFailed, CgroupError, OutputError, ProfkitError, UsageError
from ..host import procfs
from ..host.cgroup import cpu_cgroup
from ..host.quota import diagnose
from ..host.target import Target, ensure_same, pool_threads
from .budget import HANG_S, STOP_LIMIT, BudgetMonitor, times
from .clock import NS_PER_S, Clock, monotonic_ns
from .collectors.base import CaptureContext, CaptureOptions, Collector
from .registry import ALL_COLLECTORS, REGISTRY
from .runs import RunRecord, target_lock
from .startup import (
    cpu_spent_by_tool,
    tools_cpu_by_process,
    tools_cpu_seconds,
    wait_for_tools_to_settle,
    wait_until_attached,
)

# Teardown: the samplers first, so that their last samples close the window (the /proc
# sampler's last full one is each thread's CPU at the end); then the tools all at once, since
# one after the other they took 5.3 s on 2 cores (py-spy 1.5, perf record 2.8, eBPF 0.8), most
# of it each tool writing out or profkit reading what it wrote.
SAMPLERS = ("proc", "cgroup")
# Which collector goes first when the tools use too much CPU, costliest kind first.
DROP_ORDER = ("perf_record", "pyspy", "perf_stat", "ebpf")


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


# A write that failed for one of these ends the capture: the disk, not a collector, is at fault.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[list[str]]:
    """SIGINT/SIGTERM end the window early; the bundle is kept and marked partial."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def teardown_shielded() -> Iterator[None]:
    """Ignore further Ctrl-C while probes and tools are being stopped (each stop is bounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def target_state(target: Target) -> str | None:
    """None while the target is the process that was inspected; else why it is not."""
    try:
        if procfs.read_stat(target.pid).start_ticks != target.start_ticks:
            return "target exited"
        if target.exe and os.readlink(f"/proc/{target.pid}/exe") != target.exe:
            return "target exec'd"
    except (FileNotFoundError, ProcessLookupError):
        return "target exited"
    except OSError:
        return None
    return None


def capture(
    request: CaptureRequest,
    stop: threading.Event | None = None,
    on_tick: Callable[[float, dict[str, Collector]], None] | None = None,
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
                with RunRecord(target.pid, target.start_ticks, where, fd) as record:
                    state: dict = {"overlaps": overlaps}
                    try:
                        return _capture(
                            request,
                            held_directory(fd),
                            stop or threading.Event(),
                            on_tick,
                            record,
                            state,
                        )
                    except BaseException as exc:
                        record.keep = not _abort(held_directory(fd), state, exc, request.clock)
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


def _abort(directory: Path, state: dict, exc: BaseException, clock: Clock) -> bool:
    """Stop what still runs, remove perf.data and mark the bundle aborted; False when the mark
    could not be written (the run record then stays for the next run to mark it)."""
    if isinstance(exc, KeyboardInterrupt):
        reason = "interrupted"
    elif isinstance(exc, ProfkitError):
        reason = exc.format_message()
    elif isinstance(exc, OSError) and exc.errno in DISK_FULL:
        reason = f"a write failed: {exc.strerror}"
    else:
        reason = f"internal error: {type(exc).__name__}: {exc}"[:300]
    results: dict[str, CollectorResult] = state.get("results", {})
    with teardown_shielded():
        with contextlib.suppress(Exception):
            _stop_collectors(state.get("running", {}), results, clock)
        # It holds every process's samples; it never outlives a capture that did not finish.
        with contextlib.suppress(OSError):
            (directory / PERF_DATA).unlink()
        manifest = state.get("manifest")
        if manifest is None:
            return True
        manifest["status"] = "aborted"
        manifest["status_reason"] = reason
        manifest["collectors"] = {
            n: collector_record(results[n]) for n in ALL_COLLECTORS if n in results
        }
        try:
            write_manifest(directory, manifest)
        except OutputError:
            # On a full disk there may be no room for a second copy: rewrite it in place,
            # compact, into the blocks the old one frees.
            try:
                fd = os.open(directory / MANIFEST, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
                with os.fdopen(fd, "w") as handle:
                    handle.write(json.dumps(manifest, separators=(",", ":")))
            except OSError:
                return False
    return True


def _options_record(request: CaptureRequest) -> dict[str, object]:
    """The options in the manifest, spelled as bundles have always spelled them (the budget
    twice, once as a string)."""
    options, budget = request.options, request.options.budget
    return {
        "duration_s": request.duration_s,
        "rate_hz": request.rate_hz,
        "collectors": list(request.collectors),
        "max_size_mb": request.max_size_mb,
        "budget": {"stopped_share": budget.overhead_share, "tool_cores": budget.tool_cores},
        "perf_callgraph": options.perf_callgraph,
        "perf_rate": str(options.perf_rate_hz),
        "perf_scope": options.perf_scope,
        "pyspy_mode": options.pyspy_mode,
        "pyspy_mode_reason": options.pyspy_mode_reason,
        "ebpf_sched": options.ebpf_sched,
        "python_stacks": options.python_stacks,
        "overhead_budget": str(budget.overhead_share),
    }


def _quota(target: Target) -> dict[str, object] | None:
    try:
        cg = cpu_cgroup(target.pid)
    except CgroupError:
        return None
    pool, source = pool_threads(target)
    return diagnose(cg, None, target.cpus_allowed, pool, source).as_dict()


def _start_collectors(
    request: CaptureRequest,
    context: CaptureContext,
    results: dict[str, CollectorResult],
    running: dict[str, Collector],
) -> dict[str, Collector]:
    for name in ALL_COLLECTORS:
        if name not in request.collectors:
            results[name] = CollectorResult(
                name, "skipped", "not in this capture's set (--collectors adds it)"
            )
            continue
        if name in request.unavailable:
            results[name] = CollectorResult(name, "unavailable", request.unavailable[name])
            continue
        collector = REGISTRY[name]()
        availability = collector.available(request.target)
        if not availability.ok:
            results[name] = CollectorResult(name, "unavailable", availability.reason)
            continue
        try:
            collector.start(context)
        except Exception as exc:  # one broken collector must not stop the others
            results[name] = CollectorResult(name, "failed", f"start failed: {exc}"[:300])
            continue
        running[name] = collector
    return running


def _capture(
    request: CaptureRequest,
    directory: Path,
    stop: threading.Event,
    on_tick: Callable[[float, dict[str, Collector]], None] | None,
    record: RunRecord,
    state: dict,
) -> dict:
    target = request.target
    names = {tid: procfs.read_stat(target.pid, tid).comm for tid in procfs.list_tids(target.pid)}
    manifest = new_manifest(
        target_record(target, names, torch_version_of(target)),
        _quota(target),
        _options_record(request),
    )
    if state["overlaps"]:
        manifest["overlapped_with"] = state["overlaps"]
    write_manifest(directory, manifest)
    state["manifest"] = manifest
    context = CaptureContext(
        target,
        directory,
        request.rate_hz,
        request.duration_s,
        request.clock,
        request.options,
        record.add_child,
    )
    results: dict[str, CollectorResult] = state.setdefault("results", {})
    running: dict[str, Collector] = state.setdefault("running", {})
    tools_cpu_before = tools_cpu_seconds(record)
    _start_collectors(request, context, results, running)
    if not running:
        raise CaptureFailed(
            "no collector could start: " + "; ".join(f"{n}: {r.reason}" for n, r in results.items())
        )
    with stop_on_signals(stop) as received:
        # A Ctrl-C while the tools start ends the waits too; the window is then empty.
        attach_stop_s = None
        if "pyspy" in running and request.options.pyspy_mode != "nonblocking":
            attach_stop_s = wait_until_attached(target, request.clock, stop)
        settle_s = wait_for_tools_to_settle(record, request.clock, stop)
        status, reason = "complete", ""
        window_start = request.clock()
        tools_cpu_start = tools_cpu_by_process(record)
        monitor = BudgetMonitor(request.options.budget, window_start)
        dropped: dict[str, str] = {}
        deadline = window_start + int(request.duration_s * NS_PER_S)
        next_check = window_start + NS_PER_S
        while request.clock() < deadline and not stop.is_set():
            # Every wake-up of profkit is CPU the target may need: twice a second is enough to
            # see the target exit and to refresh the terminal line; a signal ends the wait.
            stop.wait(min(0.5, max(0.0, (deadline - request.clock()) / NS_PER_S)))
            gone = target_state(target)
            if gone:
                status, reason = gone, f"the {gone} during the capture"
                break
            now = request.clock()
            if now >= next_check:
                next_check = now + NS_PER_S
                _enforce_budget(monitor, running, results, dropped, record, now, request.clock)
            if on_tick:
                on_tick((now - window_start) / NS_PER_S, running)
        if stop.is_set():
            status = "partial"
            reason = f"stopped early by {received[0]}" if received else "stopped early"
    window_end = request.clock()
    tools_cpu_window = cpu_spent_by_tool(tools_cpu_start, tools_cpu_by_process(record))
    with teardown_shielded():
        stop_seconds = _stop_collectors(running, results, request.clock)
    for name in dropped:
        if name in results:
            results[name] = replace(results[name], status="partial", reason=dropped[name])
    degraded = enforce_max_size(directory, int(request.max_size_mb * 1024 * 1024))
    for name in degraded:
        owner = OWNER.get(name)
        if owner in results and results[owner].status == "ok":
            results[owner] = replace(
                results[owner],
                status="partial",
                reason=f"{name} dropped to keep the bundle under --max-size",
            )
    manifest.update(
        {
            "status": status,
            "status_reason": reason,
            "window": {
                "start_ns": window_start,
                "end_ns": window_end,
                "requested_s": request.duration_s,
                # What profkit and its tools spent while the window was open: on a saturated
                # machine this is CPU the target did not get.
                "tools_cpu_s": round(sum(tools_cpu_window.values()), 4),
                "tools_cpu_by_tool_s": tools_cpu_window,
            },
            "collectors": {n: collector_record(results[n]) for n in ALL_COLLECTORS if n in results},
            "startup": {
                "tools_cpu_s": round(sum(tools_cpu_start.values()) - tools_cpu_before, 3),
                "settle_s": round(settle_s, 3),
                # py-spy --native's long attach stop that the window waited out (None: none
                # was seen before the timeout, and it may come inside the window).
                "pyspy_attach_stop_s": None if attach_stop_s is None else round(attach_stop_s, 3),
            },
            # How long each collector took to stop and write its part, after the window.
            "teardown_s": stop_seconds,
            "budget_decisions": [vars(d) for d in monitor.decisions],
            "dropped_for_size": degraded,
        }
    )
    overlaps = [*state["overlaps"], *record.overlaps()]
    if overlaps:
        manifest["overlapped_with"] = overlaps
    write_manifest(directory, manifest)
    return manifest


def _stop_collectors(
    running: dict[str, Collector], results: dict[str, CollectorResult], clock: Clock
) -> dict[str, float]:
    """Stop every running collector (samplers first, then the tools in parallel); how long
    each took."""
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


def _enforce_budget(
    monitor: BudgetMonitor,
    running: dict[str, Collector],
    results: dict[str, CollectorResult],
    dropped: dict[str, str],
    record: RunRecord,
    now: int,
    clock: Clock,
) -> None:
    proc = running.get("proc")
    stops = monitor.stopped_share(proc.rows, now) if proc is not None else None  # type: ignore[attr-defined]
    children = [int(c["pid"]) for c in record.data["children"]]  # type: ignore[union-attr]
    cores = monitor.tool_cores([os.getpid(), *children], now)
    if not monitor.settled(now):
        return
    pyspy = running.get("pyspy")
    over_budget = stops is not None and (
        stops.lower > STOP_LIMIT * monitor.budget.overhead_share or stops.longest_s >= HANG_S
    )
    if over_budget and pyspy is not None and "pyspy" not in dropped:
        assert stops is not None
        why = (
            f"target stopped {100 * stops.share:.1f}% of the time by py-spy (at least "
            f"{100 * stops.lower:.1f}% with 95% confidence over {stops.instants} samples), over "
            f"{times(STOP_LIMIT)} the {100 * monitor.budget.overhead_share:g}% budget"
            if stops.longest_s < HANG_S
            else f"py-spy held the target stopped for {stops.longest_s:.1f} s at once"
        )
        still = pyspy.back_off(why, now)  # type: ignore[attr-defined]
        monitor.record(clock(), "nonblocking" if still else "drop", "pyspy", why)
        if not still:
            dropped["pyspy"] = why
        return
    if cores is not None and cores > monitor.budget.tool_cores:
        for name in DROP_ORDER:
            if name in running and name not in dropped and name != "proc":
                why = (
                    f"profkit's tools used {cores:.2f} cores, over the "
                    f"{monitor.budget.tool_cores:g}-core budget"
                )
                results[name] = replace(running.pop(name).stop(), status="partial", reason=why)
                dropped[name] = why
                monitor.record(now, "drop", name, why)
                return


def progress_printer(stream=sys.stderr) -> Callable[[float, dict[str, Collector]], None] | None:  # type: ignore[no-untyped-def]
    """A one-line live display on a terminal; nothing when output is not a TTY."""
    if not stream.isatty():
        return None
    last = [0.0]

    def tick(elapsed: float, running: dict[str, Collector]) -> None:
        if elapsed - last[0] < 0.4:
            return
        last[0] = elapsed
        parts = [f"{elapsed:5.1f}s"]
        proc = running.get("proc")
        cores = proc.latest_cores() if proc is not None else None  # type: ignore[attr-defined]
        if cores is not None:
            parts.append(f"{cores:.2f} cores")
        cg = running.get("cgroup")
        throttled = cg.latest_throttled_pct() if cg is not None else None  # type: ignore[attr-defined]
        if throttled is not None:
            parts.append(f"throttled {throttled:.0f}%")
        parts += [f"{n} {c.progress()}" for n, c in running.items() if c.progress()]
        stream.write("\r" + "  ".join(parts)[:100].ljust(100))
        stream.flush()

    return tick
