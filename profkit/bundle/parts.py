"""What a bundle holds: the files each collector writes into it, and the record of how each
collector did. Capture writes these names and analysis reads them, so both take them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

MANIFEST = "manifest.json"
# The manifest's layout version: a reader refuses a bundle with a newer one.
SCHEMA_VERSION = 1

PROC = "proc.json"
CGROUP = "cgroup.json"
PYSPY = "pyspy.json"
PERF_STAT = "perf_stat.json"
PERF = "perf.json"
EBPF = "ebpf.json"
# Every thread's native stacks from the eBPF sampler, in perf.json's tables: written where perf
# record is not in the capture, and read as its samples.
NATIVE = "native.json"

PYSPY_TRACE = "pyspy.chrometrace.json"  # py-spy's first segment; a restart starts another
PYSPY_TRACES = "pyspy.chrometrace*.json"
PERF_STAT_CSV = "perf_stat.csv"
PERF_DATA = "perf.data"
# Every child tool's output streams, named after the tool.
TOOL_STDOUT = "*.stdout"
TOOL_STDERR = "*.stderr"


def pyspy_trace(segment: int) -> str:
    """py-spy's own output for one segment (a mode change restarts py-spy into a new one)."""
    return PYSPY_TRACE if segment == 0 else f"pyspy.chrometrace.{segment}.json"


@dataclass(frozen=True)
class Part:
    name: str  # in the bundle directory; a glob where the collector writes several
    collector: str  # "" for the files of every child tool
    # The tool's own output, kept for diagnosis: analysis reads only the normalised parts, so
    # a raw part is the first to go when the bundle is over its size bound.
    raw: bool = False


PARTS = (
    Part(PROC, "proc"),
    Part(CGROUP, "cgroup"),
    Part(PYSPY_TRACES, "pyspy", raw=True),
    Part(PYSPY, "pyspy"),
    Part(PERF_STAT_CSV, "perf_stat", raw=True),
    Part(PERF_STAT, "perf_stat"),
    Part(PERF_DATA, "perf_record", raw=True),
    Part(PERF, "perf_record"),
    Part(EBPF, "ebpf"),
    Part(NATIVE, "ebpf"),
    Part(TOOL_STDOUT, "", raw=True),
    Part(TOOL_STDERR, "", raw=True),
)
# The collector whose data a normalised part is: it reads as partial when the part is dropped.
OWNER = {part.name: part.collector for part in PARTS if not part.raw}


# How a collector did, and how the capture as a whole ended (the manifest's status).
CollectorStatus = Literal["ok", "partial", "failed", "unavailable", "skipped"]
CaptureStatus = Literal[
    "capturing", "complete", "partial", "target exited", "target exec'd", "aborted"
]


@dataclass(frozen=True)
class CollectorResult:
    """How one collector did; the manifest keeps one per collector under its name."""

    name: str
    status: CollectorStatus
    reason: str = ""
    samples: int = 0
    lost: int = 0
    start_ns: int | None = None
    end_ns: int | None = None
    files: tuple[str, ...] = ()
    notes: dict[str, object] = field(default_factory=dict)
