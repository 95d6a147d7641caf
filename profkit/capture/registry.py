"""Every collector by the name the manifest records it under, in the order a capture starts
them: the slow eBPF compile first, so that it does not eat into the window."""

from __future__ import annotations

from collections.abc import Callable

from .collectors.base import Collector
from .collectors.cgroupstat import CgroupCollector
from .collectors.perfrecord import PerfRecordCollector
from .collectors.perfstat import PerfStatCollector
from .collectors.procstat import ProcCollector
from .collectors.pyspy import PySpyCollector
from .ebpf.collector import EbpfCollector

REGISTRY: dict[str, Callable[[], Collector]] = {
    "ebpf": EbpfCollector,
    "proc": ProcCollector,
    "cgroup": CgroupCollector,
    "perf_stat": PerfStatCollector,
    "perf_record": PerfRecordCollector,
    "pyspy": PySpyCollector,
}
ALL_COLLECTORS = tuple(REGISTRY)
