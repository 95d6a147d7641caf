"""Reading the programs' in-kernel logs and counters after the window, whichever loader loaded
them (bcc's tables or libbpf's, which offer the same access)."""

from __future__ import annotations

import ctypes
from typing import Any

from .loader import BpfProgram


def sampled_count(python: dict[str, object]) -> int:
    """The sampler's on-CPU samples, of Python threads and of the others."""
    count = 0
    for part in ("samples", "dispatched"):
        table = python.get(part)
        if isinstance(table, dict):
            count += len(table.get("t_ns") or ())
    return count


def entry_count(bpf: BpfProgram) -> int:
    return int(bpf["entry_count"][ctypes.c_int(0)].value)


def read_log(
    bpf: BpfProgram, log_name: str, count: int, lost: dict[str, int], which: str
) -> list[tuple[int, Any]]:
    """The first `count` entries of an in-kernel array log, in the order they were written."""
    log = bpf[log_name]
    capacity = len(log)
    used = min(count, capacity)
    lost[which] += max(0, count - capacity)
    if used <= 0 or capacity <= 1:
        return []
    # A batch lookup copies the whole array, used or not: for a log mostly empty, one lookup
    # per used entry is cheaper.
    if used < capacity // 8:
        return [(i, log[ctypes.c_int(i)]) for i in range(used)]
    try:
        entries = [(k.value, v) for k, v in log.items_lookup_batch()]
    except Exception:  # kernels without batch lookups: one lookup per entry
        entries = [(i, log[ctypes.c_int(i)]) for i in range(used)]
    return sorted(((index, v) for index, v in entries if index < used), key=lambda e: e[0])
