"""The Prometheus view of the agent's state, served with prometheus_client.

A custom collector renders the last snapshot the agent published, so a scrape never waits on a
window being closed. Counters carry the time of the window they close: Prometheus then lines
them up with what happened, not with when it was scraped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..bundle.names import shown
from .labels import LABELS
from .profiles import Pusher
from .series import TargetSeries


@dataclass
class AgentCounters:
    cpu_seconds: float = 0.0
    targets: int = 0
    processes: int = 0
    pushes: int = 0
    push_failures: int = 0
    profiles_written: int = 0
    interval_s: float = 15.0
    probe_failures: int = 0
    pusher: Pusher | None = None  # read at scrape time: pushes finish between windows


@dataclass(frozen=True)
class Snapshot:
    series: tuple[TargetSeries, ...]
    agent: AgentCounters


def _counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=[*LABELS, *extra])


def _gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=[*LABELS, *extra])


class WatchCollector(Collector):
    def __init__(self) -> None:
        # Held by the agent while it updates the series, and here while a scrape reads them.
        self.lock = threading.Lock()
        self._snapshot = Snapshot((), AgentCounters())

    def publish(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        with self.lock:
            return iter(list(self._families(self._snapshot)))

    def _families(self, snap: Snapshot) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        process = _counter(
            "profkit_process_cpu_seconds_total", "CPU time of the target's processes (/proc)."
        )
        python = _counter(
            "profkit_python_cpu_seconds_total",
            "CPU time in the threads the Python interpreter knows (threads with a Python stack).",
        )
        pool = _counter(
            "profkit_pool_cpu_seconds_total",
            "CPU time of the thread pool's worker threads (/proc).",
            ("runtime",),
        )
        regions = _counter(
            "profkit_pool_regions_total",
            "Parallel regions the pool ran (OpenMP region probe; where the probe is switched, "
            "those of its on-times: see profkit_region_probe_duty).",
            ("runtime",),
        )
        with_stack = _counter(
            "profkit_pool_regions_with_stack_total",
            "Of those regions, the ones whose dispatching Python stack the walker read and "
            "resolved: the part of the pool's CPU that site= places by stack.",
            ("runtime",),
        )
        without_stack = _counter(
            "profkit_walker_regions_without_stack_total",
            "Regions of any probed pool that the walker read no Python stack for, by reason "
            "(no_thread_state, read_failures, no_python_frame).",
            ("reason",),
        )
        site = _counter(
            "profkit_site_cpu_seconds_total",
            "Pool CPU time by the Python line that dispatched it (top 10 sites; the rest as "
            'site="other").',
            ("runtime", "site", "op"),
        )
        periods = _counter(
            "profkit_cgroup_cpu_periods_total",
            "Enforcement periods that elapsed (the tightest CPU limit's cpu.stat nr_periods).",
        )
        throttled = _counter(
            "profkit_cgroup_cpu_throttled_periods_total",
            "Periods in which the group was throttled (cpu.stat nr_throttled).",
        )
        throttled_s = _counter(
            "profkit_cgroup_cpu_throttled_seconds_total",
            "Time the group was throttled (cpu.stat throttled_usec / throttled_time).",
        )
        threads = _gauge(
            "profkit_pool_threads",
            "Threads in the pool's team (workers + dispatcher).",
            ("runtime",),
        )
        duty = _gauge(
            "profkit_region_probe_duty",
            "Part of the time the region probe was on in the last window: 1, or less where the "
            "target starts so many regions that the probe is switched on and off to keep within "
            "its budget (regions then count the on-times only; sites are split by them).",
            ("runtime",),
        )
        quota = _gauge("profkit_quota_cores", "The tightest CPU quota above the target, in cores.")
        recommended = _gauge(
            "profkit_recommended_threads", "The largest pool the CPU budget keeps running."
        )
        finding = _gauge(
            "profkit_finding",
            "1 while the finding holds for the target, else 0.",
            ("id", "severity"),
        )
        for s in snap.series:
            labels = list(s.labels)
            ts = s.updated_unix or None
            process.add_metric(labels, s.process_cpu, timestamp=ts)
            python.add_metric(labels, s.python_cpu, timestamp=ts)
            for runtime, value in s.pool_cpu.items():
                pool.add_metric([*labels, runtime], value, timestamp=ts)
            for runtime, value in s.regions.items():
                regions.add_metric([*labels, runtime], value, timestamp=ts)
            for runtime, value in s.regions_with_stack.items():
                with_stack.add_metric([*labels, runtime], value, timestamp=ts)
            for reason, value in s.walk_failures.items():
                without_stack.add_metric([*labels, reason], value, timestamp=ts)
            for (runtime, name, op), value in s.site_cpu.items():
                # The target's names, already shown() as frames; again here, as every output.
                site_labels = [*labels, runtime, shown(name), shown(op)]
                site.add_metric(site_labels, value, timestamp=ts)
            if s._baselines or s.periods:
                read = s.cgroup_updated_unix or ts
                periods.add_metric(labels, s.periods, timestamp=read)
                throttled.add_metric(labels, s.throttled_periods, timestamp=read)
                throttled_s.add_metric(labels, s.throttled_seconds, timestamp=read)
            if not s.live:
                continue  # gauges describe running processes only
            for runtime, team in s.pool_threads.items():
                threads.add_metric([*labels, runtime], team)
            for runtime, part in s.probe_duty.items():
                duty.add_metric([*labels, runtime], part)
            if s.quota_cores is not None:
                quota.add_metric(labels, s.quota_cores)
            if s.recommended is not None:
                recommended.add_metric(labels, s.recommended)
            for finding_id, (severity, value) in s.findings.items():
                finding.add_metric([*labels, finding_id, severity], value)
        yield from (process, python, pool, regions, with_stack, without_stack, site)
        yield from (periods, throttled, throttled_s)
        yield from (threads, duty, quota, recommended, finding)
        agent = snap.agent
        if agent.pusher is not None:
            agent.pushes, agent.push_failures = agent.pusher.sent, agent.pusher.failed
        yield CounterMetricFamily(
            "profkit_agent_cpu_seconds_total",
            "CPU time of the profkit agent itself (user + system).",
            value=agent.cpu_seconds,
        )
        yield GaugeMetricFamily(
            "profkit_targets", "Targets with a live process.", value=agent.targets
        )
        yield GaugeMetricFamily("profkit_processes", "Processes watched.", value=agent.processes)
        yield CounterMetricFamily(
            "profkit_profile_pushes_total", "Profiles posted to --push.", value=agent.pushes
        )
        yield CounterMetricFamily(
            "profkit_profile_push_failures_total",
            "Profiles --push could not deliver (unreachable, refused, an HTTP error, an answer "
            "that is not HTTP, or none within 5 s).",
            value=agent.push_failures,
        )
        yield CounterMetricFamily(
            "profkit_profiles_written_total",
            "Profiles written to the rolling directory.",
            value=agent.profiles_written,
        )
        yield CounterMetricFamily(
            "profkit_probe_failures_total",
            "Targets whose region probe could not be loaded (pool CPU still comes from /proc).",
            value=agent.probe_failures,
        )
