"""The manifest as analysis and rendering read it: typed records built from the checked JSON.

The capture writes manifest.json as a plain table (capture/session.py); these records hold the
values a reader takes from it, each checked as it is taken, so that no consumer looks keys up
in a dict and guesses their types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast, get_args

from .load import MIN_CORES, Fields
from .parts import CaptureStatus, CollectorStatus


@dataclass(frozen=True)
class Runtime:
    """A thread-pool runtime the target had mapped: its name and the file it came from."""

    name: str
    path: str


@dataclass(frozen=True)
class TargetFacts:
    """The target as the capture found it."""

    pid: int | None
    cmdline: tuple[str, ...]
    thread_names: Mapping[int, str]
    cpus_allowed: int | None
    pool_threads: int | None
    pool_threads_source: str | None
    openmp_runtime: str | None
    torch_version: str | None
    runtimes: tuple[Runtime, ...]

    @staticmethod
    def read(target: Fields) -> TargetFacts:
        return TargetFacts(
            pid=target.maybe_integer("pid"),
            cmdline=tuple(target.texts("cmdline", optional=True)),
            thread_names={
                t.integer("tid"): t.text("name") for t in target.objects("threads", optional=True)
            },
            cpus_allowed=target.maybe_integer("cpus_allowed"),
            pool_threads=target.maybe_integer("pool_threads"),
            pool_threads_source=target.maybe_text("pool_threads_source"),
            openmp_runtime=target.maybe_text("openmp_runtime"),
            torch_version=target.maybe_text("torch_version"),
            runtimes=tuple(
                Runtime(r.text("name"), r.text("path"))
                for r in target.objects("runtimes", optional=True)
            ),
        )


@dataclass(frozen=True)
class QuotaFacts:
    """The CPU quota the capture read from the target's cgroup, as it stood at the start."""

    effective_cores: float | None
    source: str | None
    period_us: int | None


@dataclass(frozen=True)
class CollectorOutcome:
    """How one collector did."""

    status: CollectorStatus | None
    reason: str | None


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Manifest:
    """What a reader takes from manifest.json."""

    status: CaptureStatus | None
    status_reason: str | None
    target: TargetFacts
    quota: QuotaFacts | None  # None where none was read, or the table is empty
    window: Window | None
    collectors: Mapping[str, CollectorOutcome]
    # The --budget at which py-spy --native would have placed the pool, where the capture ran
    # it --nonblocking with no eBPF probe (options.pyspy_native_budget); None elsewhere.
    native_budget: float | None = None

    @staticmethod
    def read(manifest: Fields) -> Manifest:
        quota = manifest.maybe_table("quota")
        window = manifest.maybe_table("window")
        collectors = manifest.table("collectors", optional=True)
        options = manifest.table("options", optional=True)
        return Manifest(
            status=cast(
                "CaptureStatus | None", manifest.maybe_choice("status", get_args(CaptureStatus))
            ),
            status_reason=manifest.maybe_text("status_reason"),
            target=TargetFacts.read(manifest.table("target", optional=True)),
            quota=QuotaFacts(
                quota.maybe_number("effective_cores", MIN_CORES),
                quota.maybe_text("source"),
                quota.maybe_integer("period_us"),
            )
            if quota is not None and quota.data
            else None,
            window=Window(window.integer("start_ns", 0), window.integer("end_ns", 0))
            if window is not None
            else None,
            collectors={name: _outcome(collectors.table(name)) for name in collectors.data},
            native_budget=options.maybe_number("pyspy_native_budget", 0.0),
        )


def _outcome(collector: Fields) -> CollectorOutcome:
    collector.table("notes", optional=True)  # checked here; the readers of each part take it
    status = collector.maybe_choice("status", get_args(CollectorStatus))
    return CollectorOutcome(cast("CollectorStatus | None", status), collector.maybe_text("reason"))
