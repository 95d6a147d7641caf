"""A target's series: cumulative counters, gauges and findings over its processes' windows.

A target is every watched process with the same labels (name, and pod and container under
Kubernetes). Counters add across its processes and across restarts, so that a restarted process
continues its target's series; cgroup counters are kept per cgroup, not per process, so that
replicas sharing a cgroup are counted once and a restart into the same cgroup loses nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.findings import (
    FANOUT_MIN_CORES,
    FANOUT_MIN_SHARE,
    Finding,
    oversubscription,
)
from ..analysis.throttling import QuotaUse
from ..host.cgroup import CgroupCpu, CpuStat, recommended_threads
from .probe import Frame
from .process import ProcessWindow, SiteKey

TOP_SITES = 10
OTHER_SITE = "other"
FINDING_IDS = ("quota-oversubscription", "cpu-fanout")
DEFAULT_SEVERITY = {"quota-oversubscription": "medium", "cpu-fanout": "medium"}
# A target with no live process for EXPIRE_WINDOWS intervals, and at least EXPIRE_MIN_S (or
# --expire), leaves the metrics: without it every short-lived script kept its series for the
# agent's lifetime. A restart within that time continues the series; a later one starts it again
# from 0 (a counter reset, which rate() and increase() take in their stride).
EXPIRE_WINDOWS = 4
EXPIRE_MIN_S = 60.0


@dataclass(frozen=True)
class CgroupReadings:
    """A target's cgroups' cpu.stat, read together at `unix` (the middle of the reads)."""

    groups: dict[Path, tuple[CgroupCpu, CpuStat]]
    unix: float


@dataclass(frozen=True)
class CgroupDelta:
    periods: int
    throttled_periods: int
    throttled_seconds: float
    usage_seconds: float | None


def cgroup_delta(before: CpuStat, after: CpuStat) -> CgroupDelta:
    usage = None
    if before.usage_ns is not None and after.usage_ns is not None:
        usage = max(0, after.usage_ns - before.usage_ns) / 1e9
    return CgroupDelta(
        max(0, after.nr_periods - before.nr_periods),
        max(0, after.nr_throttled - before.nr_throttled),
        max(0, after.throttled_ns - before.throttled_ns) / 1e9,
        usage,
    )


@dataclass(frozen=True)
class WindowSummary:
    """The target's last window, as `top` shows it and findings judge it."""

    seconds: float
    process_cores: float
    python_cores: float
    pools: dict[str, tuple[float, float, int]]  # runtime -> (cores, regions/s, team size)
    sites: list[tuple[str, SiteKey, float]]  # (runtime, site, cores), largest first
    quota_cores: float | None
    quota_source: str | None
    throttled_pct: float | None
    recommended_threads: int
    processes: int
    notes: tuple[str, ...]


@dataclass
class TargetSeries:
    labels: tuple[str, ...]
    process_cpu: float = 0.0
    python_cpu: float = 0.0
    pool_cpu: dict[str, float] = field(default_factory=dict)
    regions: dict[str, int] = field(default_factory=dict)
    regions_with_stack: dict[str, int] = field(default_factory=dict)
    walk_failures: dict[str, int] = field(default_factory=dict)  # reason -> regions
    site_cpu: dict[tuple[str, str, str], float] = field(default_factory=dict)
    periods: int = 0
    throttled_periods: int = 0
    throttled_seconds: float = 0.0
    pool_threads: dict[str, int] = field(default_factory=dict)
    probe_duty: dict[str, float] = field(default_factory=dict)  # runtime -> the last window's
    quota_cores: float | None = None
    recommended: int | None = None
    findings: dict[str, tuple[str, int]] = field(default_factory=dict)
    active: list[Finding] = field(default_factory=list)
    updated_unix: float = 0.0
    cgroup_updated_unix: float = 0.0  # when its cgroup counters were read
    live: bool = False
    last: WindowSummary | None = None
    profile: dict[tuple[str, ...], float] = field(default_factory=dict)
    profile_seconds: float = 0.0
    gone_since: float | None = None  # when it was first seen with no live process
    _baselines: dict[Path, CpuStat] = field(default_factory=dict)
    _site_totals: dict[SiteKey, float] = field(default_factory=dict)

    def prime(self, directory: Path, stat: CpuStat) -> None:
        """A new process's cgroup, read when it is first watched: its first window counts."""
        self._baselines.setdefault(directory, stat)

    def cgroup_window(self, groups: dict[Path, tuple[CgroupCpu, CpuStat]]) -> CgroupDelta | None:
        """Add each cgroup's growth since the last window; None the first time one is seen."""
        total: CgroupDelta | None = None
        for directory, (_, stat) in groups.items():
            before = self._baselines.get(directory)
            self._baselines[directory] = stat
            if before is None:
                continue
            d = cgroup_delta(before, stat)
            self.periods += d.periods
            self.throttled_periods += d.throttled_periods
            self.throttled_seconds += d.throttled_seconds
            total = (
                d
                if total is None
                else CgroupDelta(
                    total.periods + d.periods,
                    total.throttled_periods + d.throttled_periods,
                    total.throttled_seconds + d.throttled_seconds,
                    None
                    if total.usage_seconds is None or d.usage_seconds is None
                    else total.usage_seconds + d.usage_seconds,
                )
            )
        for directory in [d for d in self._baselines if d not in groups]:
            del self._baselines[directory]
        return total

    def _top_sites(self) -> set[SiteKey]:
        """The target's top sites by CPU so far. A site that leaves them keeps its series (a
        counter that stops growing); what it burns from then on goes to site="other"."""
        return set(sorted(self._site_totals, key=lambda k: -self._site_totals[k])[:TOP_SITES])

    def add(
        self,
        windows: list[ProcessWindow],
        groups: dict[Path, tuple[CgroupCpu, CpuStat]],
        cpus_allowed: int,
        now_unix: float,
        cgroup_unix: float | None = None,
    ) -> None:
        """One window of the target's processes, closed at now_unix, and its cgroups' counters,
        read at cgroup_unix (now_unix where not given)."""
        seconds = max((w.seconds for w in windows), default=0.0)
        self.process_cpu += sum(w.process_cpu for w in windows)
        self.python_cpu += sum(w.python_cpu for w in windows)
        pools: dict[str, list[float]] = {}
        teams: dict[str, int] = {}
        sites: dict[tuple[str, SiteKey], float] = {}
        stacks: dict[SiteKey, tuple[Frame, ...]] = {}
        duties: dict[str, float] = {}
        for w in windows:
            if w.runtime is None:
                continue
            self.pool_cpu[w.runtime] = self.pool_cpu.get(w.runtime, 0.0) + w.pool_cpu
            self.regions[w.runtime] = self.regions.get(w.runtime, 0) + w.regions
            self.regions_with_stack[w.runtime] = (
                self.regions_with_stack.get(w.runtime, 0) + w.regions_with_stack
            )
            for reason, count in w.walk_failures.items():
                self.walk_failures[reason] = self.walk_failures.get(reason, 0) + count
            acc = pools.setdefault(w.runtime, [0.0, 0.0])
            acc[0] += w.pool_cpu
            acc[1] += w.regions
            teams[w.runtime] = max(teams.get(w.runtime, 0), w.team_size)
            duties[w.runtime] = min(duties.get(w.runtime, 1.0), w.probe_duty)
            for key, cpu in w.site_cpu.items():
                sites[(w.runtime, key)] = sites.get((w.runtime, key), 0.0) + cpu
                self._site_totals[key] = self._site_totals.get(key, 0.0) + cpu
            stacks.update(w.site_stacks)
        self.probe_duty.update(duties)
        top = self._top_sites()
        for (runtime, key), cpu in sites.items():
            label = key if key in top else SiteKey(None, row=OTHER_SITE)
            series = (runtime, label.site, label.op)
            self.site_cpu[series] = self.site_cpu.get(series, 0.0) + cpu
        self.pool_threads = teams
        cg = next(iter(groups.values()), None)
        delta = self.cgroup_window(groups)
        effective = None if cg is None else cg[0].effective
        self.quota_cores = effective.cores if effective else None
        self.recommended = recommended_threads(self.quota_cores, cpus_allowed)
        pool_cores = {rt: acc[0] / seconds if seconds else 0.0 for rt, acc in pools.items()}
        process_cores = sum(w.process_cpu for w in windows) / seconds if seconds else 0.0
        quota = None
        if effective is not None:
            quota = QuotaUse(
                effective.cores,
                effective.cgroup,
                effective.period_us,
                (delta.usage_seconds / seconds)
                if delta and delta.usage_seconds and seconds
                else None,
                delta.periods if delta else 0,
                delta.throttled_periods if delta else 0,
                delta.throttled_seconds if delta else 0.0,
                None,
                self.recommended,
            )
        team_source = next((w.team_source for w in windows if w.runtime), "")
        self.active = judge(teams, team_source, pool_cores, process_cores, quota, self.recommended)
        for finding_id in FINDING_IDS:
            held = next((f for f in self.active if f.id == finding_id), None)
            previous = self.findings.get(finding_id, (DEFAULT_SEVERITY[finding_id], 0))[0]
            self.findings[finding_id] = (held.severity, 1) if held else (previous, 0)
        self.updated_unix = now_unix
        self.cgroup_updated_unix = now_unix if cgroup_unix is None else cgroup_unix
        self.live = True
        self.profile, self.profile_seconds = merged_profile(windows, sites, stacks, teams), seconds
        self.last = WindowSummary(
            seconds=seconds,
            process_cores=process_cores,
            python_cores=sum(w.python_cpu for w in windows) / seconds if seconds else 0.0,
            pools={
                rt: (pool_cores[rt], acc[1] / seconds if seconds else 0.0, teams.get(rt, 0))
                for rt, acc in pools.items()
            },
            sites=sorted(
                ((rt, key, cpu / seconds if seconds else 0.0) for (rt, key), cpu in sites.items()),
                key=lambda item: -item[2],
            ),
            quota_cores=self.quota_cores,
            quota_source=effective.cgroup if effective else None,
            throttled_pct=quota.throttled_periods_pct if quota else None,
            recommended_threads=self.recommended,
            processes=len(windows),
            notes=(),
        )


def expiry_s(interval_s: float) -> float:
    return max(EXPIRE_WINDOWS * interval_s, EXPIRE_MIN_S)


def expire(
    series: dict[tuple[str, ...], TargetSeries],
    live: set[tuple[str, ...]],
    now_unix: float,
    after_s: float,
) -> list[tuple[str, ...]]:
    """Drop the series of targets gone for after_s; the labels dropped. Called once a window,
    so that the metrics and the agent's memory hold only targets seen lately."""
    dropped = []
    for labels, target in list(series.items()):
        if labels in live:
            target.gone_since = None
        elif target.gone_since is None:
            target.gone_since = now_unix
        elif now_unix - target.gone_since >= after_s:
            del series[labels]
            dropped.append(labels)
    return dropped


def judge(
    teams: dict[str, int],
    team_source: str,
    pool_cores: dict[str, float],
    process_cores: float,
    quota: QuotaUse | None,
    budget_threads: int,
) -> list[Finding]:
    """The findings a window supports without py-spy or perf: the pool against the quota (as
    `report` judges it), and a pool larger than the CPU budget burning a real share of the
    process (cpu-fanout's rule, from /proc and the region probe instead of py-spy)."""
    found: list[Finding] = []
    for runtime, team in teams.items():
        cores = pool_cores.get(runtime, 0.0)
        over = oversubscription(team, team_source, cores, quota)
        if over is not None:
            found.append(over)
        share = cores / process_cores if process_cores else 0.0
        if cores >= FANOUT_MIN_CORES and share >= FANOUT_MIN_SHARE and team > budget_threads:
            found.append(
                Finding(
                    "cpu-fanout",
                    "high" if share >= 0.5 else "medium",
                    f"the {runtime} pool ({team} threads) burns {cores:.2f} of the process's "
                    f"{process_cores:.2f} cores, more threads than the {budget_threads} the CPU "
                    "budget runs",
                    {"pool_cores": round(cores, 3), "team_size": team},
                    f"cap the pool at {budget_threads} (OMP_NUM_THREADS / torch.set_num_threads), "
                    "or run the top site's op under torch.set_num_threads(1)",
                )
            )
    return found


def site_frame_names(frames: tuple[Frame, ...]) -> tuple[str, ...]:
    return tuple(f"{f.function} ({f.file.rsplit('/', 1)[-1]}:{f.line})" for f in frames)


def merged_profile(
    windows: list[ProcessWindow],
    sites: dict[tuple[str, SiteKey], float],
    stacks: dict[SiteKey, tuple[Frame, ...]],
    teams: dict[str, int],
) -> dict[tuple[str, ...], float]:
    """`flame --view merged` from what the watch collectors see: Python threads by name (no
    py-spy, so no Python frames of their own), each pool's CPU under the Python stack of the
    site that dispatched it, other threads by name. CPU seconds."""
    weights: dict[tuple[str, ...], float] = {}

    def add(stack: tuple[str, ...], seconds: float) -> None:
        if seconds > 0 and not math.isnan(seconds):
            key = ("process", *stack)
            weights[key] = weights.get(key, 0.0) + seconds

    for w in windows:
        for name, cpu in w.python_threads.items():
            add((f"[python thread {name.rsplit(' (', 1)[0]}]",), cpu)
        for name, cpu in w.other_threads.items():
            add(("[other threads]", name.rsplit(" (", 1)[0]), cpu)
    for (runtime, key), cpu in sites.items():
        frames = stacks.get(key)
        site = site_frame_names(frames) if frames else (f"[dispatch site {key.site}]",)
        add((*site, f"[{runtime} pool x{teams.get(runtime, 0)}]"), cpu)
    return weights
