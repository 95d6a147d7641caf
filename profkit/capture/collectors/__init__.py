"""Collectors, one module each, behind the Protocol in base.py; registered by name here."""

from __future__ import annotations

from collections.abc import Callable

from ..ebpf.collector import EbpfCollector
from .base import Collector
from .cgroupstat import CgroupCollector
from .perfrecord import PerfRecordCollector
from .perfstat import PerfStatCollector
from .procstat import ProcCollector
from .pyspy import PySpyCollector

REGISTRY: dict[str, Callable[[], Collector]] = {
    "ebpf": EbpfCollector,
    "proc": ProcCollector,
    "cgroup": CgroupCollector,
    "perf_stat": PerfStatCollector,
    "perf_record": PerfRecordCollector,
    "pyspy": PySpyCollector,
}
