"""The watch loop: every interval, find targets, close each process's window, publish.

A target that exits, restarts or cannot be read is dropped or picked up again at the next
interval; nothing about one target stops the agent. SIGTERM and SIGINT end it at once: every
probe is detached before it returns.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CgroupError, ListenError, NoSuchProcess, NotPythonTarget, PermissionDenied
from ..host.cgroup import CgroupCpu, CpuStat, cpu_cgroup, read_cpu_stat
from ..host.target import inspect
from .discover import Candidate, Identity, candidates
from .labels import labels_of
from .loading import ProbeLoader
from .metrics import AgentCounters, Snapshot, WatchCollector
from .options import WatchOptions
from .probe import NoProbe, RegionProbe
from .process import ProcessWindow, WatchedProcess
from .profiles import ProfileDirectory, Pusher, PushItem, pprof_bytes
from .series import CgroupReadings, TargetSeries, expire, expiry_s

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer


def say(message: str) -> None:
    print(f"profkit: {message}", file=sys.stderr, flush=True)


def leave(agent: Agent, code: int) -> int:
    """The exit status, once the agent is closed. A probe still loading (a compile takes
    seconds on a busy machine, and the interpreter's exit would wait for its helper threads)
    is left to the kernel: it has attached nothing yet, or only perf-event uprobes, which the
    kernel detaches as the process's descriptors close."""
    if agent.load_in_flight:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


class Agent:
    def __init__(self, options: WatchOptions, notify: Callable[[str], None] = say) -> None:
        self.options = options
        self.notify = notify
        self.stop = threading.Event()
        self.processes: dict[Identity, tuple[WatchedProcess, tuple[str, ...]]] = {}
        self.series: dict[tuple[str, ...], TargetSeries] = {}
        self.rejected: set[Identity] = set()
        self.collector = WatchCollector()
        self.counters = AgentCounters(interval_s=options.interval_s)
        self.profiles = (
            ProfileDirectory(Path(options.profiles_dir), options.keep_profiles)
            if options.profiles_dir
            else None
        )
        self.pusher: Pusher | None = None
        self._loader: ProbeLoader | None = None
        self.load_in_flight = False  # a probe's load outlived close(): see leave()
        self._server: WSGIServer | None = None
        self._said_waiting = False
        self._said: set[str] = set()
        self.windows = 0

    # -- lifecycle -------------------------------------------------------------------------

    def serve(self) -> None:
        """Bind the metrics endpoint; fails before anything is attached."""
        listen = self.options.listen
        if listen is None:
            return
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import start_wsgi_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        try:
            self._server, _ = start_wsgi_server(listen.port, listen.host, registry)
        except OSError as exc:
            why = {
                errno.EADDRINUSE: "the port is in use",
                errno.EADDRNOTAVAIL: "the address is not on this host",
                errno.EACCES: "permission denied",
            }.get(exc.errno or 0, exc.strerror or str(exc))
            raise ListenError(f"cannot listen on {listen}: {why}") from exc

    def install_signals(self) -> None:
        def handler(signum: int, frame: object) -> None:
            self.stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def start(self) -> None:
        self.serve()
        if self.options.push_url:
            self.pusher = Pusher(self.options.push_url, self.notify)
            self.counters.pusher = self.pusher

    def run(self, on_window: Callable[[Agent], None] | None = None) -> None:
        """Until stop is set: one window per interval, on a fixed schedule."""
        try:
            self.tick()
            next_at = time.monotonic() + self.options.interval_s
            while not self.stop.wait(max(0.0, next_at - time.monotonic())):
                self.tick()
                if on_window:
                    on_window(self)
                next_at += self.options.interval_s
                if next_at < time.monotonic():  # a late window: keep the schedule, skip ahead
                    next_at = time.monotonic() + self.options.interval_s
        finally:
            self.close()

    def close(self) -> None:
        for watched, _ in self.processes.values():
            watched.close()
        self.processes.clear()
        if self._loader is not None:
            self.load_in_flight = not self._loader.close()
        if self.profiles is not None:
            self.profiles.close()
        if self.pusher is not None:
            self.pusher.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- one interval ------------------------------------------------------------------------

    def tick(self) -> None:
        now_unix = time.time()
        windows = self._close_windows()
        # Read right after the processes, before discovery (which may compile probes for
        # seconds). The cgroup counters carry the time they were read at, not now_unix: on a
        # loaded machine the processes' windows can take long enough to close that a period
        # or more of the cgroup's elapses in between.
        cgroups = {labels: self._cgroups(items) for labels, items in windows.items()}
        self._discover()
        with self.collector.lock:
            updated = self._update(windows, cgroups, now_unix)
        for series in updated:
            self._emit_profile(series, now_unix)

    def _cgroups(self, items: list[tuple[WatchedProcess, ProcessWindow]]) -> CgroupReadings:
        groups: dict[Path, tuple[CgroupCpu, CpuStat]] = {}
        began = time.time()
        for watched, _ in items:
            with contextlib.suppress(CgroupError, OSError):
                cg = cpu_cgroup(watched.pid)
                if cg.stat_directory not in groups:
                    groups[cg.stat_directory] = (cg, read_cpu_stat(cg))
        return CgroupReadings(groups, (began + time.time()) / 2)

    def _close_windows(self) -> dict[tuple[str, ...], list[tuple[WatchedProcess, ProcessWindow]]]:
        grouped: dict[tuple[str, ...], list[tuple[WatchedProcess, ProcessWindow]]] = {}
        for identity, (watched, labels) in list(self.processes.items()):
            try:
                if watched.exec_seen():
                    # Another program now: found again as a new target, labels and walker anew.
                    self._drop(identity)
                    continue
                window = watched.close_window()
            except (FileNotFoundError, ProcessLookupError, OSError):
                self._drop(identity)
                continue
            if watched.probe.switched:
                self._say_once(
                    f"switched-{identity}",
                    f"{labels[0]} (pid {watched.pid}): {watched.probe.switched}",
                )
            grouped.setdefault(labels, []).append((watched, window))
        return grouped

    def _drop(self, identity: Identity) -> None:
        watched, _ = self.processes.pop(identity)
        watched.close()
        # said once per process, kept while it lives
        self._said -= {f"watch-{identity}", f"switched-{identity}"}

    def _discover(self) -> None:
        for identity, (watched, labels) in list(self.processes.items()):
            if self.stop.is_set():
                return
            if watched.awaiting_runtime:
                try:
                    if watched.look_for_runtime() and self.options.probes:
                        self._load_probe(watched, labels)
                except OSError:
                    self._drop(identity)
        found = {c.identity: c for c in candidates(self.options.selectors)}
        for identity in [i for i in self.processes if i not in found]:
            self._drop(identity)  # exited, or its pid now names another process
        self.rejected &= set(found)
        for identity, candidate in found.items():
            if self.stop.is_set():
                break
            if identity in self.processes or identity in self.rejected:
                continue
            self._add(candidate)
        if not self.processes and not self._said_waiting:
            self._said_waiting = True
            self.notify(
                f"no Python process matches {self.options.selectors.describe()}; waiting "
                f"(checking every {self.options.interval_s:g} s)"
            )
        elif self.processes:
            self._said_waiting = False

    def _add(self, candidate: Candidate) -> None:
        try:
            target = inspect(candidate.pid)
        except (NoSuchProcess, NotPythonTarget, PermissionDenied) as exc:
            self.rejected.add(candidate.identity)
            if isinstance(exc, PermissionDenied):
                self._say_once(f"perm-{candidate.pid}", str(exc))
            return
        if target.start_ticks != candidate.start_ticks:
            return  # the pid was reused between the scan and now: next interval
        labels = labels_of(target.pid, target.cmdline, candidate.comm, self.options.name)
        probe = (
            RegionProbe(target, self.options.ebpf_loader)
            if self.options.probes
            else NoProbe(target)
        )
        watched = WatchedProcess(target, probe)
        try:
            watched.begin(load_probe=False)
        except (FileNotFoundError, ProcessLookupError, OSError):
            watched.close()
            return
        self.processes[candidate.identity] = (watched, labels)
        if watched.needs_probe:
            self._load_probe(watched, labels)
        series = self.series.setdefault(labels, TargetSeries(labels))
        with contextlib.suppress(CgroupError, OSError):
            cg = cpu_cgroup(target.pid)
            stat = read_cpu_stat(cg)
            with self.collector.lock:
                series.prime(cg.stat_directory, stat)
        if not self.options.probes:
            state = ""
        elif watched.awaiting_runtime:
            state = ", region probe once it loads an OpenMP runtime"
        else:
            state = ", region probe loading"
        self._say_once(
            f"watch-{candidate.identity}", f"watching {labels[0]} (pid {target.pid}{state})"
        )

    def _load_probe(self, watched: WatchedProcess, labels: tuple[str, ...]) -> None:
        """Queue the probe's load on the loader thread; announced once it is done."""
        if self._loader is None:
            self._loader = ProbeLoader(self.stop)
        self._loader.submit(watched, lambda: self._announce(watched, labels))

    def _announce(self, watched: WatchedProcess, labels: tuple[str, ...]) -> None:
        probe, pid = watched.probe, watched.pid
        if watched.awaiting_runtime:
            return  # said once the runtime is loaded
        if probe.reason:
            self.counters.probe_failures += probe.status != "on"
            self._say_once(
                f"probe-{labels[0]}-{probe.reason}", f"{labels[0]} (pid {pid}): {probe.reason}"
            )
        elif probe.walker_reason:
            self._say_once(
                f"walker-{labels[0]}",
                f"{labels[0]} (pid {pid}): {probe.walker_reason}; dispatch sites are "
                'reported as site="unknown"',
            )

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.notify(message)

    def _update(
        self,
        grouped: dict[tuple[str, ...], list[tuple[WatchedProcess, ProcessWindow]]],
        cgroups: dict[tuple[str, ...], CgroupReadings],
        now_unix: float,
    ) -> list[TargetSeries]:
        updated = []
        for labels, items in grouped.items():
            series = self.series.setdefault(labels, TargetSeries(labels))
            cpus = max(w.target.cpus_allowed for w, _ in items)
            read = cgroups[labels]
            series.add([w for _, w in items], read.groups, cpus, now_unix, read.unix)
            updated.append(series)
        live = {labels for _, labels in self.processes.values()}
        after_s = self.options.expire_s or expiry_s(self.options.interval_s)
        expire(self.series, live, now_unix, after_s)
        for labels, series in self.series.items():
            series.live = labels in live
        self.windows += 1
        times = os.times()
        self.counters.cpu_seconds = times.user + times.system
        self.counters.targets = len(live)
        self.counters.processes = len(self.processes)
        self.collector.publish(Snapshot(tuple(self.series.values()), self.counters))
        return updated

    def _emit_profile(self, series: TargetSeries, now_unix: float) -> None:
        if not series.profile or (self.profiles is None and self.pusher is None):
            return
        data = pprof_bytes(series.profile, series.profile_seconds)
        start = now_unix - series.profile_seconds
        if self.profiles is not None:
            try:
                self.profiles.write(series.labels, data, start, now_unix)
                self.counters.profiles_written += 1
            except OSError as exc:
                self._say_once("profiles-dir", f"cannot write profiles: {exc}")
        if self.pusher is not None:
            self.pusher.submit(PushItem(series.labels, data, start, now_unix))
