"""Where the parallel-region probes go in each pool runtime a target maps.

Every mapped copy is probed: a process can map several copies of one runtime (torch's
libgomp.so.1 beside scikit-learn's bundled libgomp-<hash>.so), and the copy that runs the
regions is not always the one found first. Each region records which copy started it: under bcc
each copy gets its own entry handler (on_entry_N), compiled in; the prebuilt CO-RE program has
one entry handler, told the copy by each attachment's cookie.

Entry points per runtime:
- libgomp: GOMP_parallel and the GOMP_parallel_loop_* / GOMP_parallel_sections variants that
  compilers emit for combined constructs; all end in gomp_team_end, whose team barrier is the
  region's end (profkit/capture/ebpf/probe_points.py), else each entry's `ret`s.
- libiomp5 / libomp (LLVM, Intel): __kmpc_fork_call, ended at its `ret`s.
- OpenBLAS (numpy's bundled scipy-openblas and others): exec_blas, the function that hands a
  level-3 call's pieces to its own pthread pool and waits for them, ended at its `ret`s. Its name
  may carry a prefix in some builds, so the symbol table is searched by suffix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ....host.mapped import MappedFile, UnverifiedFile
from ....host.target import Runtime
from .code import TOOL_ERRORS, function_symbols, return_sites, symbol_address
from .points import ProbePoint, entry_point, gomp_region_end


@dataclass(frozen=True)
class RuntimeKind:
    pool: str  # the pool the report names: "openmp" or "openblas"
    entries: tuple[str, ...]  # entry symbols, the first one required
    # Which argument register holds the team size asked for (1: the first), 0 where none does.
    requested_arg: int
    gomp_end: bool  # the region ends at libgomp's team barrier


GOMP_ENTRIES = (
    "GOMP_parallel",
    "GOMP_parallel_loop_static",
    "GOMP_parallel_loop_dynamic",
    "GOMP_parallel_loop_guided",
    "GOMP_parallel_loop_runtime",
    "GOMP_parallel_sections",
)
KINDS = {
    # GOMP_parallel*(fn, data, num_threads, ...): 0 threads means "the runtime's setting".
    "libgomp": RuntimeKind("openmp", GOMP_ENTRIES, 3, True),
    "libiomp5": RuntimeKind("openmp", ("__kmpc_fork_call",), 0, False),
    "libomp": RuntimeKind("openmp", ("__kmpc_fork_call",), 0, False),
    # exec_blas(num, queue): num pieces, one per thread of the pool that runs them.
    "openblas": RuntimeKind("openblas", ("exec_blas",), 1, False),
}


@dataclass(frozen=True)
class Entry:
    symbol: str
    address: int  # file address of the probe: the symbol, or its emulated point
    point: ProbePoint | None  # the emulated instruction chosen, if any


@dataclass(frozen=True)
class RuntimeProbes:
    index: int
    runtime: Runtime
    kind: RuntimeKind
    entries: tuple[Entry, ...]
    end: ProbePoint | None  # libgomp's team-barrier branch
    returns: tuple[int, ...]  # else every `ret` of every entry symbol

    @property
    def handler(self) -> str:
        return handler_name(self.index)

    def traps(self) -> tuple[bool, bool]:
        """Whether a region's entry trap and its end trap sit on instructions the kernel
        emulates (points.py): what each costs is measured (costs.py). An entry at a symbol's
        start, a `ret` and a uretprobe count as single-stepped."""
        entry = all(e.point is not None and e.point.emulated for e in self.entries)
        end = self.end is not None and self.end.emulated
        return entry, end

    def describe(self) -> dict[str, object]:
        return {
            "index": self.index,
            "name": self.runtime.name,
            "path": self.runtime.path,
            "pool": self.kind.pool,
            "entries": [e.symbol for e in self.entries],
            "end": "team barrier" if self.end else "returns",
        }


@dataclass(frozen=True)
class Uprobe:
    """One region probe, as either loader attaches it."""

    path: str  # the file as the target's maps name it: shown, never opened
    file: MappedFile | None  # the mapped file itself (None: a file of profkit's own choosing)
    address: int | None  # the file's virtual address; None: at `symbol` (its start, or return)
    symbol: str
    entry: bool  # a region's entry (else its end)
    retprobe: bool  # a uretprobe on `symbol`
    runtime: int  # the copy's index
    requested_arg: int  # RuntimeKind.requested_arg, for an entry
    what: str  # how the capture's list of attached probes names it

    @property
    def described(self) -> str:
        return f"{'uretprobe' if self.retprobe else 'uprobe'}:{self.path}:{self.what}"

    def target_path(self) -> str:
        """The path to hand the kernel: one that reaches the mapped file itself, checked now
        (host/mapped.py); UnverifiedFile where it cannot be."""
        return self.file.checked() if self.file is not None else self.path


def region_uprobes(copy: RuntimeProbes) -> list[Uprobe]:
    """A copy's probes, the ends first: a region entered between an entry probe and its end
    probe would never be seen to end."""
    path, file = copy.runtime.path, copy.runtime.file
    index, arg = copy.index, copy.kind.requested_arg

    def end(address: int | None, symbol: str, what: str, retprobe: bool = False) -> Uprobe:
        return Uprobe(path, file, address, symbol, False, retprobe, index, 0, what)

    probes: list[Uprobe] = []
    if copy.end is not None:
        what = f"{copy.end.address:#x} (region end, after the team barrier)"
        probes.append(end(copy.end.address, "", what))
    elif copy.returns:
        # A uprobe on each `ret` rather than a uretprobe: see returns.py.
        probes += [end(a, "", f"{a:#x} (return)") for a in copy.returns]
    else:
        probes += [end(None, e.symbol, e.symbol, retprobe=True) for e in copy.entries]
    for entry in copy.entries:
        if entry.point is not None:
            what = f"{entry.address:#x} ({entry.symbol} entry, {entry.point.instruction})"
            probes.append(
                Uprobe(path, file, entry.address, entry.symbol, True, False, index, arg, what)
            )
        else:
            probes.append(
                Uprobe(path, file, None, entry.symbol, True, False, index, arg, entry.symbol)
            )
    return probes


def handler_name(index: int) -> str:
    return f"on_entry_{index}"


def requested_expression(arg: int) -> str:
    """The team size as bcc's C reads it."""
    return f"PT_REGS_PARM{arg}(ctx)" if arg else "0"


def handler_source(runtimes: list[Runtime]) -> str:
    """One entry handler per copy (by its index in `runtimes`), appended to
    probes/openmp.bpf.c; written before the copies' symbols are read, so that the compile and
    the reading run side by side."""
    handlers = []
    for i, r in enumerate(runtimes):
        requested = requested_expression(KINDS[r.name].requested_arg)
        handlers.append(
            f"\nint {handler_name(i)}(struct pt_regs *ctx) {{\n"
            f"    return region_entry({i}, (u32)({requested}));\n}}\n"
        )
    return "".join(handlers)


def find_symbol(path: str, symbol: str) -> tuple[str, int] | None:
    """The symbol, or the one function whose name ends in _symbol (a prefixed build)."""
    address = symbol_address(path, symbol)
    if address is not None:
        return symbol, address
    pattern = re.compile(rf"^\w+_{re.escape(symbol)}$")
    return next(
        (
            (name, address)
            for name, address in function_symbols(path).items()
            if pattern.match(name)
        ),
        None,
    )


def find_probes(index: int, runtime: Runtime) -> RuntimeProbes | None:
    """Where one copy's probes go; None when it has no entry point profkit knows. The copy is
    read as the target maps it (host/mapped.py); UnverifiedFile where it cannot be."""
    kind = KINDS.get(runtime.name)
    if kind is None:
        return None
    path = runtime.readable() if runtime.file is not None else runtime.path
    try:
        entries: list[Entry] = []
        for wanted in kind.entries:
            found = find_symbol(path, wanted)
            if found is None:
                if not entries:
                    return None  # the main entry point is required
                continue
            symbol, address = found
            point = entry_point(path, symbol)
            entries.append(Entry(symbol, point.address if point else address, point))
        end = gomp_region_end(path) if kind.gomp_end else None
        returns: list[int] = []
        if end is None:
            for entry in entries:
                returns += return_sites(path, entry.symbol) or []
    except UnverifiedFile:
        raise
    except TOOL_ERRORS:
        return None
    return RuntimeProbes(index, runtime, kind, tuple(entries), end, tuple(returns))


def probeable(runtimes: tuple[Runtime, ...]) -> list[Runtime]:
    """Every mapped copy of a runtime with region entry points, each file once."""
    seen: set[object] = set()
    out = []
    for runtime in runtimes:
        mapping = runtime.file.mapping if runtime.file is not None else None
        key = (mapping.device, mapping.inode) if mapping is not None else runtime.path
        if runtime.name in KINDS and key not in seen:
            seen.add(key)
            out.append(runtime)
    return out
