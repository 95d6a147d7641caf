"""cgroup CPU quota discovery and measurement, for cgroup v1, v2 and nested limits.

A quota is a time budget per period for the whole group, not a number of cores: a pool of N
threads may run on N CPUs at once and then be throttled for the rest of the period. The limit
that binds is the tightest one on the path from the process's cgroup to the root.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CgroupError

MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Mount:
    version: str  # "v1" or "v2"
    root: str  # the cgroup path this mount shows at its mount point
    mount_point: Path
    controllers: frozenset[str]


@dataclass(frozen=True)
class CpuLimit:
    cgroup: str  # cgroup path, e.g. /profkit/q
    directory: Path
    quota_us: int
    period_us: int

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us


@dataclass(frozen=True)
class CgroupCpu:
    """Where a process's CPU control lives and which ancestor's limit binds."""

    version: str
    cgroup: str
    directory: Path
    limits: tuple[CpuLimit, ...]  # every ancestor with a limit, leaf first
    usage_mount: Mount | None = None  # v1 only: the cpuacct tree, where usage is counted

    @property
    def effective(self) -> CpuLimit | None:
        return min(self.limits, key=lambda limit: limit.cores, default=None)

    @property
    def effective_cores(self) -> float | None:
        limit = self.effective
        return None if limit is None else limit.cores

    @property
    def stat_directory(self) -> Path:
        # Periods and throttling are counted where the bandwidth limit is set.
        limit = self.effective
        return self.directory if limit is None else limit.directory


@dataclass(frozen=True)
class CpuStat:
    nr_periods: int
    nr_throttled: int
    throttled_ns: int
    usage_ns: int | None
    nr_bursts: int | None
    burst_ns: int | None


@dataclass(frozen=True)
class Pressure:
    some_total_us: int
    full_total_us: int | None


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, mount_point = fields[3], Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            mounts.append(Mount("v2", root, mount_point, frozenset()))
        else:
            options = set(tail[2].split(","))
            mounts.append(Mount("v1", root, mount_point, frozenset(options)))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map each v1 controller (and "" for the v2 unified tree) to the process's cgroup path."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths[""] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller.removeprefix("name=")] = path
    return paths


def _resolve(mount: Mount, cgroup_path: str) -> Path:
    relative = cgroup_path
    if mount.root != "/" and cgroup_path.startswith(mount.root):
        relative = cgroup_path[len(mount.root) :]
    return mount.mount_point / relative.lstrip("/")


def _ancestors(directory: Path, mount_point: Path) -> list[Path]:
    chain = [directory]
    while chain[-1] != mount_point and mount_point in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _v1_limit(directory: Path, mount: Mount) -> CpuLimit | None:
    quota = _read_int(directory / "cpu.cfs_quota_us")
    period = _read_int(directory / "cpu.cfs_period_us")
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return CpuLimit(_cgroup_name(directory, mount), directory, quota, period)


def _v2_limit(directory: Path, mount: Mount) -> CpuLimit | None:
    try:
        quota_text, period_text = (directory / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    if quota_text == "max":
        return None
    return CpuLimit(_cgroup_name(directory, mount), directory, int(quota_text), int(period_text))


def _cgroup_name(directory: Path, mount: Mount) -> str:
    relative = directory.relative_to(mount.mount_point).as_posix()
    base = mount.root.rstrip("/")
    return f"{base}/{relative}" if relative != "." else (mount.root or "/")


def _v2_has_cpu(mount: Mount) -> bool:
    try:
        return "cpu" in (mount.mount_point / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def cpu_cgroup(pid: int, proc: Path = Path("/proc"), mountinfo: Path = MOUNTINFO) -> CgroupCpu:
    """Find the CPU controller of a process and every quota above it."""
    try:
        paths = parse_proc_cgroup((proc / str(pid) / "cgroup").read_text())
        mounts = parse_mountinfo(mountinfo.read_text())
    except FileNotFoundError as exc:
        raise CgroupError(f"cannot read cgroup of pid {pid}: {exc.strerror}") from exc
    v1_cpu = next((m for m in mounts if m.version == "v1" and "cpu" in m.controllers), None)
    if v1_cpu is not None and "cpu" in paths:
        directory = _resolve(v1_cpu, paths["cpu"])
        limits = [
            lim
            for d in _ancestors(directory, v1_cpu.mount_point)
            if (lim := _v1_limit(d, v1_cpu)) is not None
        ]
        acct = next((m for m in mounts if m.version == "v1" and "cpuacct" in m.controllers), None)
        return CgroupCpu("v1", paths["cpu"], directory, tuple(limits), acct)
    v2 = next((m for m in mounts if m.version == "v2" and _v2_has_cpu(m)), None)
    if v2 is not None and "" in paths:
        directory = _resolve(v2, paths[""])
        limits = [
            lim
            for d in _ancestors(directory, v2.mount_point)
            if (lim := _v2_limit(d, v2)) is not None
        ]
        return CgroupCpu("v2", paths[""], directory, tuple(limits))
    raise CgroupError(f"no cgroup CPU controller is mounted for pid {pid}")


def parse_cpu_stat(text: str, version: str) -> CpuStat:
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    if version == "v2":
        throttled_ns = values.get("throttled_usec", 0) * 1000
        usage_ns = values["usage_usec"] * 1000 if "usage_usec" in values else None
        burst_ns = values["burst_usec"] * 1000 if "burst_usec" in values else None
    else:
        throttled_ns = values.get("throttled_time", 0)
        usage_ns = None
        burst_ns = values.get("burst_time")
    return CpuStat(
        nr_periods=values.get("nr_periods", 0),
        nr_throttled=values.get("nr_throttled", 0),
        throttled_ns=throttled_ns,
        usage_ns=usage_ns,
        nr_bursts=values.get("nr_bursts"),
        burst_ns=burst_ns,
    )


def read_cpu_stat(cg: CgroupCpu) -> CpuStat:
    try:
        stat = parse_cpu_stat((cg.stat_directory / "cpu.stat").read_text(), cg.version)
    except OSError as exc:
        raise CgroupError(f"cannot read {cg.stat_directory / 'cpu.stat'}: {exc.strerror}") from exc
    if cg.version == "v1" and cg.usage_mount is not None:
        # v1 keeps usage in the cpuacct tree; read it for the same group whose periods count.
        group = cg.effective.cgroup if cg.effective else cg.cgroup
        usage = _read_int(_resolve(cg.usage_mount, group) / "cpuacct.usage")
        stat = CpuStat(
            stat.nr_periods,
            stat.nr_throttled,
            stat.throttled_ns,
            usage,
            stat.nr_bursts,
            stat.burst_ns,
        )
    return stat


def read_pressure(cg: CgroupCpu) -> Pressure | None:
    if cg.version != "v2":
        return None
    try:
        text = (cg.directory / "cpu.pressure").read_text()
    except OSError:
        return None
    totals: dict[str, int] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key == "total":
                totals[kind] = int(value)
    if "some" not in totals:
        return None
    return Pressure(totals["some"], totals.get("full"))


@dataclass(frozen=True)
class QuotaWindow:
    """What a group did with its budget over a measured window."""

    seconds: float
    periods: int
    throttled_periods: int
    throttled_seconds: float
    usage_cores: float | None
    pressure_some_pct: float | None
    bursts: int | None
    burst_seconds: float | None

    @property
    def throttled_periods_pct(self) -> float | None:
        return None if self.periods == 0 else 100.0 * self.throttled_periods / self.periods


def window_between(
    before: CpuStat,
    after: CpuStat,
    seconds: float,
    pressure_before: Pressure | None = None,
    pressure_after: Pressure | None = None,
) -> QuotaWindow:
    usage = None
    if before.usage_ns is not None and after.usage_ns is not None and seconds > 0:
        usage = (after.usage_ns - before.usage_ns) / 1e9 / seconds
    pressure = None
    if pressure_before and pressure_after and seconds > 0:
        stalled_us = pressure_after.some_total_us - pressure_before.some_total_us
        pressure = 100.0 * stalled_us / 1e6 / seconds
    bursts = (
        None
        if after.nr_bursts is None or before.nr_bursts is None
        else (after.nr_bursts - before.nr_bursts)
    )
    burst_s = (
        None
        if after.burst_ns is None or before.burst_ns is None
        else ((after.burst_ns - before.burst_ns) / 1e9)
    )
    return QuotaWindow(
        seconds=seconds,
        periods=after.nr_periods - before.nr_periods,
        throttled_periods=after.nr_throttled - before.nr_throttled,
        throttled_seconds=(after.throttled_ns - before.throttled_ns) / 1e9,
        usage_cores=usage,
        pressure_some_pct=pressure,
        bursts=bursts,
        burst_seconds=burst_s,
    )


def measure(
    cg: CgroupCpu,
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> QuotaWindow:
    pressure_before, before, start = read_pressure(cg), read_cpu_stat(cg), clock()
    sleep(seconds)
    after, end, pressure_after = read_cpu_stat(cg), clock(), read_pressure(cg)
    return window_between(before, after, end - start, pressure_before, pressure_after)


def recommended_threads(effective_cores: float | None, cpus_allowed: int) -> int:
    """The largest pool that the budget can keep running: floor of the binding limit, at least 1."""
    budget = cpus_allowed if effective_cores is None else min(effective_cores, cpus_allowed)
    return max(1, math.floor(budget + 1e-9))
