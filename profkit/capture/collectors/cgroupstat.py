"""cgroup sampler: the target's group's cpu.stat (and cpu.pressure on v2), at 10 Hz under a
quota and 1 Hz without one."""

from __future__ import annotations

import json

from ...bundle.parts import CGROUP, CollectorResult
from ...bundle.safefile import write_new
from ...errors import CgroupError
from ...host.cgroup import CgroupCpu, cpu_cgroup, read_cpu_stat, read_pressure
from ...host.target import Target
from .base import Availability, CaptureContext
from .periodic import PeriodicSampler

COLUMNS = ("t_ns", "nr_periods", "nr_throttled", "throttled_ns", "usage_ns", "pressure_some_us")
# Under a quota each sample spans about one 100-ms period, so the timeline shows which periods
# were throttled. Without one nothing is throttled and only usage and pressure move, so reading
# them often spends profkit's CPU for nothing: once a second is enough
# (docs/results/own-cost.md#profkits-own-cpu-in-the-window).
QUOTA_INTERVAL_S = 0.1
UNLIMITED_INTERVAL_S = 1.0


class CgroupCollector:
    name = "cgroup"

    def __init__(self, interval_s: float | None = None) -> None:
        self.requested_interval_s = interval_s
        self.interval_s = interval_s or QUOTA_INTERVAL_S
        self.rows: list[tuple[int, ...]] = []
        self._cg: CgroupCpu | None = None
        self._context: CaptureContext | None = None
        self._sampler: PeriodicSampler | None = None

    def available(self, target: Target) -> Availability:
        try:
            self._cg = cpu_cgroup(target.pid)
            read_cpu_stat(self._cg)
        except CgroupError as exc:
            return Availability(False, exc.format_message())
        return Availability(True)

    def start(self, context: CaptureContext) -> None:
        self._context = context
        if self._cg is None:
            self._cg = cpu_cgroup(context.target.pid)
        limited = self._cg.effective is not None
        self.interval_s = self.requested_interval_s or (
            QUOTA_INTERVAL_S if limited else UNLIMITED_INTERVAL_S
        )
        self._sampler = PeriodicSampler(self.name, self.interval_s, self._sample, context.clock)
        self._sampler.start()

    def _sample(self, now_ns: int) -> bool:
        assert self._cg is not None
        stat = read_cpu_stat(self._cg)
        pressure = read_pressure(self._cg)
        self.rows.append(
            (
                now_ns,
                stat.nr_periods,
                stat.nr_throttled,
                stat.throttled_ns,
                -1 if stat.usage_ns is None else stat.usage_ns,
                -1 if pressure is None else pressure.some_total_us,
            )
        )
        return True

    def progress(self) -> int:
        return len(self.rows)

    def latest_throttled_pct(self) -> float | None:
        rows = self.rows[-11:]
        if len(rows) < 2:
            return None
        periods = rows[-1][1] - rows[0][1]
        return None if periods <= 0 else 100.0 * (rows[-1][2] - rows[0][2]) / periods

    def stop(self) -> CollectorResult:
        assert self._sampler is not None and self._context is not None and self._cg is not None
        self._sampler.stop()
        cg = self._cg
        limit = cg.effective
        payload = {
            "version": cg.version,
            "cgroup": cg.cgroup,
            "effective_cores": cg.effective_cores,
            "source": limit.cgroup if limit else None,
            "period_us": limit.period_us if limit else None,
            "interval_s": self.interval_s,
            "limits": [
                {"cgroup": lim.cgroup, "quota_us": lim.quota_us, "period_us": lim.period_us}
                for lim in cg.limits
            ],
            "samples": {name: [row[i] for row in self.rows] for i, name in enumerate(COLUMNS)},
        }
        write_new(self._context.directory / CGROUP, json.dumps(payload))
        error = self._sampler.error
        return CollectorResult(
            self.name,
            "failed" if error else "ok",
            reason=repr(error) if error else "",
            samples=len(self.rows),
            start_ns=self.rows[0][0] if self.rows else None,
            end_ns=self.rows[-1][0] if self.rows else None,
            files=(CGROUP,),
            notes={"interval_s": self.interval_s},
        )
