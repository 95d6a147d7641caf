"""Native stacks from the walker's cpu-clock sampler, as perf.json's tables.

Where perf record is not in the capture, the eBPF sampler that reads the Python threads' stacks
also takes every target thread's kernel and user stacks (bpf_get_stack: the kernel walks them
by frame pointers, as perf record's `--call-graph fp` does). This turns them into the tables
`perf script` gives profkit (frames as (symbol, dso), stacks root first, sample columns), named
as perf names them, so the analysis reads either without knowing which took them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .. import demangle
from .loaders.bcc import load_bcc

# Distinct stacks the in-kernel map holds (keyed by a 64-bit hash of their frames, up to 48
# user and 24 kernel frames each): about 10 MiB of kernel memory. A sample whose stack does
# not fit once the map is full is counted lost, never given another's stack.
NATIVE_STACK_ENTRIES = 16384
KERNEL_DSO = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"


class FrameNames(Protocol):
    """Address -> (symbol, dso): bcc's symbol cache (Symbols) or, without bcc,
    host.symbols.ProcessSymbols."""

    def frame(self, address: int, kernel: bool) -> tuple[str, str]: ...


class Symbols:
    """Address -> (symbol, dso) for one process and the kernel, each address resolved once,
    through bcc's symbol cache."""

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


def read_stacks(stack_map: Any) -> dict[int, tuple[list[int], list[int]]]:
    """The in-kernel map's stacks: id -> (user frames, kernel frames), each leaf first."""
    return {
        int(key.value): (
            [int(a) for a in value.user[: value.user_depth]],
            [int(a) for a in value.kernel[: value.kernel_depth]],
        )
        for key, value in stack_map.items()
    }


def native_tables(
    rows: Iterable[tuple[int, int, int]],
    stacks_by_id: dict[int, tuple[list[int], list[int]]],
    pid: int,
    period_ns: int,
    symbols: FrameNames | None = None,
) -> dict[str, Any]:
    """rows: (t_ns, tid, native stack id) per sample, 0 for none; stacks_by_id: read_stacks of
    the in-kernel map. Returns perf.json's tables, samples in time order; `lost` counts the
    samples whose id is not in the map."""
    symbols = symbols or Symbols(pid)
    frames: dict[tuple[str, str], int] = {}
    stacks: dict[tuple[int, ...], int] = {}
    by_id: dict[int, int] = {}
    columns: dict[str, list[int]] = {"t_ns": [], "tid": [], "period_ns": [], "stack": []}
    lost = 0
    for t_ns, tid, native in sorted(rows):
        if native == 0:
            continue
        stack = by_id.get(native)
        if stack is None:
            if native not in stacks_by_id:
                lost += 1
                continue
            user, kernel = stacks_by_id[native]
            # Leaf first, as perf prints a call chain: the kernel's frames, then the user's.
            chain = [frames.setdefault(symbols.frame(a, True), len(frames)) for a in kernel]
            chain += [frames.setdefault(symbols.frame(a, False), len(frames)) for a in user]
            chain.reverse()
            stack = by_id[native] = stacks.setdefault(tuple(chain), len(stacks))
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
