"""Where to put the OpenMP region probes so that each hit costs the target least.

A uprobe replaces one instruction with a breakpoint. The x86 kernel emulates a few kinds of
instruction inside the trap (push of a register, a direct jmp, jcc or call, a nop); any other is
copied out of line and single-stepped, a second exception. Measured on a 2-CPU VM (kernel 6.18,
torch's libgomp, 256-KB parallel copies in a loop): a probe on `endbr64` or on `ret` cost
10.3 us per hit, on `push`, `jmp`, `jcc` or `call` 0.6-1.4 us. The symbol and its `ret`s cost
19.7 us per region, which is 3-7% of a server's request path at 1 700 regions a second; the two
points chosen here cost 1.5 us.

Entry: a function built with CET starts with `endbr64`, which is not emulated; the instruction
after it runs on every call with the arguments still in their registers, so the probe goes there
when that one is emulated.

End: libgomp's GOMP_parallel hands over to GOMP_parallel_end, which reaches one function,
gomp_team_end, whose first act is the team's final barrier. The branch that closes that
function's first block runs once the barrier returns, on every path, and a branch is emulated.
Two shapes are known: torch's bundled copy jumps to GOMP_parallel_end, which calls or jumps
to gomp_team_end; Debian's libgomp1 has GOMP_parallel_end inlined, and GOMP_parallel jumps
either to gomp_team_end or to a local function whose only way on is gomp_team_end. Anything
else gives None, and the caller falls back to the `ret` instructions (returns.py); the
collector also counts entries against ends, so a path that bypassed the chosen point would show
as regions without an end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .returns import (
    DIRECT_JUMP,
    TOOL_ERRORS,
    disassemble,
    extent_of,
    function_extents,
    is_return,
    symbol_address,
)

DIRECT_CALL = re.compile(r"^(?:bnd\s+)?call[q]?\s+([0-9a-f]+)\b")
REGISTER_PUSH = re.compile(r"^push[q]?\s+%r\w+$")
NOPS = ("nop", "nopl", "nopw", "xchg   %ax,%ax")


# What one hit costs the thread that takes it, measured as above; used to judge a target's
# region rate before the probes stay on.
EMULATED_HIT_S = 1.0e-6
STEPPED_HIT_S = 10.3e-6


def hit_cost_s(point: ProbePoint | None) -> float:
    """A probe on this point; None is a symbol's start or a `ret`, which are single-stepped."""
    return EMULATED_HIT_S if point is not None and is_emulated(point.instruction) else STEPPED_HIT_S


@dataclass(frozen=True)
class ProbePoint:
    address: int
    instruction: str


def is_emulated(instruction: str) -> bool:
    """Whether the kernel's x86 uprobe code runs this instruction inside the trap."""
    mnemonic = instruction.split()[0] if instruction else ""
    if REGISTER_PUSH.match(instruction) or instruction.startswith(NOPS):
        return True
    if mnemonic.startswith("j"):
        return DIRECT_JUMP.match(instruction) is not None
    return DIRECT_CALL.match(instruction) is not None


def _code(path: str, address: int) -> tuple[tuple[int, int], list[tuple[int, str]]] | None:
    extent = extent_of(address, function_extents(path))
    if extent is None:
        return None
    return extent, disassemble(path, *extent)


def entry_point(path: str, symbol: str) -> ProbePoint | None:
    """The instruction after `endbr64` when the kernel emulates it; None: probe the symbol."""
    try:
        address = symbol_address(path, symbol)
        found = None if address is None else _code(path, address)
    except TOOL_ERRORS:
        return None
    if address is None or found is None:
        return None
    _, code = found
    at = [i for i, (where, _) in enumerate(code) if where == address]
    if not at or at[0] + 1 >= len(code):
        return None
    first, second = code[at[0]], code[at[0] + 1]
    if first[1].startswith("endbr64") and is_emulated(second[1]):
        return ProbePoint(*second)
    return None


def gomp_region_end(path: str) -> ProbePoint | None:
    """The branch right after libgomp's final team barrier, or None when the code differs."""
    try:
        return _gomp_region_end(path)
    except TOOL_ERRORS:
        return None


def _gomp_region_end(path: str) -> ProbePoint | None:
    parallel = symbol_address(path, "GOMP_parallel")
    parallel_end = symbol_address(path, "GOMP_parallel_end")
    if parallel is None or parallel_end is None:
        return None
    found = _code(path, parallel_end)
    if found is None:
        return None
    parts = set(_targets(found[1], found[0]))
    team_end = _common_end(path, parts)
    if team_end is None:
        return None
    # Every way out of GOMP_parallel must lead there: tail jumps into GOMP_parallel_end or its
    # parts, and no `ret` of its own.
    found = _code(path, parallel)
    if found is None:
        return None
    code, extent = found[1], found[0]
    if any(is_return(instruction) for _, instruction in code):
        return None
    exits = set(_targets(code, extent, calls=False))  # its tail calls
    if not exits or not exits <= parts | {parallel_end}:
        return None
    return _first_branch_after_call(path, team_end)


def _common_end(path: str, parts: set[int]) -> int | None:
    """The one function of `parts` that every other one goes on to and nowhere else."""
    for candidate in parts:
        others = parts - {candidate}
        if all(_outgoing(path, other) == {candidate} for other in others):
            return candidate
    return None


def _outgoing(path: str, address: int) -> set[int] | None:
    found = _code(path, address)
    return None if found is None else set(_targets(found[1], found[0]))


def _first_branch_after_call(path: str, address: int) -> ProbePoint | None:
    """The emulated branch closing the function's first block, once a call has returned."""
    found = _code(path, address)
    if found is None:
        return None
    calls = 0
    for where, instruction in found[1]:
        mnemonic = instruction.split()[0] if instruction else ""
        if DIRECT_CALL.match(instruction):
            calls += 1
        elif mnemonic.startswith(("j", "ret", "rep")) or mnemonic.startswith("call"):
            # The first block ends here: it must have waited on the barrier (a call) and end
            # in a branch the kernel emulates.
            if calls and is_emulated(instruction) and not mnemonic.startswith("call"):
                return ProbePoint(where, instruction)
            return None
    return None


def _targets(code: list[tuple[int, str]], extent: tuple[int, int], calls: bool = True) -> list[int]:
    """Direct jump (and, with calls, call) targets outside the function."""
    targets = []
    for _, instruction in code:
        match = DIRECT_JUMP.match(instruction) or (calls and DIRECT_CALL.match(instruction))
        if match:
            target = int(match.group(1), 16)
            if not extent[0] <= target < extent[1]:
                targets.append(target)
    return targets
