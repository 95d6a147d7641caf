"""Native stacks from the walker's cpu-clock sampler, as perf.json's tables.

Where perf record is not in the capture, the eBPF sampler that reads the Python threads' stacks
also takes every target thread's kernel and user stacks (bpf_get_stackid: the kernel walks them
by frame pointers, as perf record's `--call-graph fp` does). This turns them into the tables
`perf script` gives profkit (frames as (symbol, dso), stacks root first, sample columns), named
as perf names them, so the analysis reads either without knowing which took them.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from typing import Any

from .. import demangle
from .loader import load_bcc

# Distinct (kernel or user) stacks the in-kernel map holds: 16 MiB of kernel memory, as bcc's
# profile tool. A stack that does not fit, or collides with another in the map's hash, is
# counted lost rather than replaced, so no sample is given another's stack.
NATIVE_STACK_ENTRIES = 16384
KERNEL_DSO = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"
# bpf_get_stackid's errors that mean a stack was taken but not stored; -EFAULT is "no stack
# of that kind" (a sample in user mode has no kernel stack).
LOST_ERRORS = (-errno.EEXIST, -errno.ENOMEM)


class Symbols:
    """Address -> (symbol, dso) for one process and the kernel, each address resolved once."""

    def __init__(self, pid: int) -> None:
        bcc = load_bcc()
        self._user = bcc.SymbolCache(pid)
        self._kernel = bcc.SymbolCache(-1)
        self._seen: dict[tuple[bool, int], tuple[str, str]] = {}

    def frame(self, address: int, kernel: bool) -> tuple[str, str]:
        key = (kernel, address)
        found = self._seen.get(key)
        if found is None:
            name, _offset, module = (self._kernel if kernel else self._user).resolve(address, False)
            symbol = name.decode(errors="replace") if name else UNKNOWN
            dso = KERNEL_DSO if kernel else (module.decode(errors="replace") if module else UNKNOWN)
            found = self._seen[key] = (symbol, dso)
        return found


def native_tables(
    rows: Iterable[tuple[int, int, int, int]],
    stack_map: Any,
    pid: int,
    period_ns: int,
    symbols: Symbols | None = None,
) -> dict[str, Any]:
    """rows: (t_ns, tid, user stack id, kernel stack id) per sample; stack_map: the in-kernel
    stack-trace map the ids index. Returns perf.json's tables, samples in time order."""
    symbols = symbols or Symbols(pid)
    frames: dict[tuple[str, str], int] = {}
    stacks: dict[tuple[int, ...], int] = {}
    by_ids: dict[tuple[int, int], int] = {}
    columns: dict[str, list[int]] = {"t_ns": [], "tid": [], "period_ns": [], "stack": []}
    lost = 0
    for t_ns, tid, ustack, kstack in sorted(rows):
        if ustack in LOST_ERRORS or kstack in LOST_ERRORS:
            lost += 1
        if ustack < 0 and kstack < 0:
            continue
        stack = by_ids.get((ustack, kstack))
        if stack is None:
            # Leaf first, as perf prints a call chain: the kernel's frames, then the user's.
            chain = [
                frames.setdefault(symbols.frame(address, kernel), len(frames))
                for stack_id, kernel in ((kstack, True), (ustack, False))
                if stack_id >= 0
                for address in stack_map.walk(stack_id)
            ]
            chain.reverse()
            stack = by_ids[(ustack, kstack)] = stacks.setdefault(tuple(chain), len(stacks))
        columns["t_ns"].append(t_ns)
        columns["tid"].append(tid)
        columns["period_ns"].append(period_ns)
        columns["stack"].append(stack)
    tables = {
        "frames": [list(f) for f in frames],
        "stacks": [list(s) for s in stacks],
        "samples": columns,
        "lost": lost,
    }
    if demangle.available():
        tables = demangle.rename_frames(tables, demangle.demangle([name for name, _ in frames]))
    return tables
