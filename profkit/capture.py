"""Run the collectors side by side on one clock and save a session bundle."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import procfs
from .bundle import (
    collector_record,
    create_directory,
    enforce_max_size,
    new_manifest,
    target_record,
    torch_version_of,
    write_manifest,
)
from .cgroup import cpu_cgroup
from .clock import NS_PER_S, Clock, monotonic_ns
from .collectors import REGISTRY
from .collectors.base import CaptureContext, Collector, CollectorResult
from .errors import CaptureFailed, CgroupError, UsageError
from .quota_report import diagnose
from .target import Target, ensure_same, pool_threads

# Start order: the slow eBPF compile first, so that it does not eat into the window.
DEFAULT_COLLECTORS = ("ebpf", "proc", "cgroup", "perf_stat", "perf_record", "pyspy")


@dataclass
class CaptureRequest:
    target: Target
    directory: Path
    duration_s: float
    rate_hz: int
    collectors: tuple[str, ...] = DEFAULT_COLLECTORS
    max_size_mb: float = 256.0
    options: dict[str, str] = field(default_factory=dict)
    clock: Clock = monotonic_ns


def parse_collectors(text: str | None) -> tuple[str, ...]:
    if not text:
        return DEFAULT_COLLECTORS
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise UsageError(
            f"unknown collector {', '.join(unknown)}; known: {', '.join(DEFAULT_COLLECTORS)}"
        )
    return tuple(n for n in DEFAULT_COLLECTORS if n in names)


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
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _alive(target: Target) -> bool:
    try:
        return procfs.read_stat(target.pid).start_ticks == target.start_ticks
    except FileNotFoundError:
        return False


def capture(
    request: CaptureRequest,
    stop: threading.Event | None = None,
    on_tick: Callable[[float, dict[str, Collector]], None] | None = None,
) -> dict:
    """Capture into request.directory and return the manifest that was written."""
    if request.duration_s <= 0:
        raise UsageError(f"--duration must be positive, got {request.duration_s}")
    if request.rate_hz <= 0 or request.rate_hz > 1000:
        raise UsageError(f"--rate must be between 1 and 1000 Hz, got {request.rate_hz}")
    stop = stop or threading.Event()
    target = request.target
    ensure_same(target)
    old_umask = os.umask(0o077)
    try:
        directory = create_directory(request.directory)
        return _capture(request, directory, stop, on_tick)
    finally:
        os.umask(old_umask)


def _quota(target: Target) -> dict[str, object] | None:
    try:
        cg = cpu_cgroup(target.pid)
    except CgroupError:
        return None
    pool, source = pool_threads(target)
    return diagnose(cg, None, target.cpus_allowed, pool, source).as_dict()


def _capture(
    request: CaptureRequest,
    directory: Path,
    stop: threading.Event,
    on_tick: Callable[[float, dict[str, Collector]], None] | None,
) -> dict:
    target = request.target
    names = {tid: procfs.read_stat(target.pid, tid).comm for tid in procfs.list_tids(target.pid)}
    manifest = new_manifest(
        target_record(target, names, torch_version_of(target)),
        _quota(target),
        {
            "duration_s": request.duration_s,
            "rate_hz": request.rate_hz,
            "collectors": list(request.collectors),
            "max_size_mb": request.max_size_mb,
            **request.options,
        },
    )
    write_manifest(directory, manifest)
    context = CaptureContext(
        target, directory, request.rate_hz, request.duration_s, request.clock, request.options
    )
    running: dict[str, Collector] = {}
    results: dict[str, CollectorResult] = {}
    for name in DEFAULT_COLLECTORS:
        if name not in request.collectors:
            results[name] = CollectorResult(name, "skipped", "not requested (--collectors)")
            continue
        collector = REGISTRY[name]()
        availability = collector.available(target)
        if not availability.ok:
            results[name] = CollectorResult(name, "unavailable", availability.reason)
            continue
        try:
            collector.start(context)
        except Exception as exc:  # one broken collector must not stop the others
            results[name] = CollectorResult(name, "failed", f"start failed: {exc}"[:300])
            continue
        running[name] = collector
    if not running:
        raise CaptureFailed(
            "no collector could start: " + "; ".join(f"{n}: {r.reason}" for n, r in results.items())
        )
    status, reason = "complete", ""
    window_start = request.clock()
    with stop_on_signals(stop) as received:
        deadline = window_start + int(request.duration_s * NS_PER_S)
        while request.clock() < deadline and not stop.is_set():
            stop.wait(min(0.2, max(0.0, (deadline - request.clock()) / NS_PER_S)))
            if not _alive(target):
                status, reason = "target exited", "the target exited during the capture"
                break
            if on_tick:
                on_tick((request.clock() - window_start) / NS_PER_S, running)
        if stop.is_set():
            status = "partial"
            reason = f"stopped early by {received[0]}" if received else "stopped early"
    window_end = request.clock()
    with teardown_shielded():
        for name in reversed(list(running)):
            try:
                results[name] = running[name].stop()
            except Exception as exc:
                results[name] = CollectorResult(name, "failed", f"stop failed: {exc}"[:300])
    dropped = enforce_max_size(directory, int(request.max_size_mb * 1024 * 1024))
    manifest.update(
        {
            "status": status,
            "status_reason": reason,
            "window": {
                "start_ns": window_start,
                "end_ns": window_end,
                "requested_s": request.duration_s,
            },
            "collectors": {
                n: collector_record(results[n]) for n in DEFAULT_COLLECTORS if n in results
            },
            "dropped_for_size": dropped,
        }
    )
    write_manifest(directory, manifest)
    return manifest


def progress_printer(stream=sys.stderr) -> Callable[[float, dict[str, Collector]], None] | None:  # type: ignore[no-untyped-def]
    """A one-line live display on a terminal; nothing when output is not a TTY."""
    if not stream.isatty():
        return None
    last = [0.0]

    def tick(elapsed: float, running: dict[str, Collector]) -> None:
        if elapsed - last[0] < 0.5:
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
