"""Where to put the OpenMP region probes so that each hit costs the target least.

A uprobe replaces one instruction with a breakpoint. The x86 kernel emulates a few kinds of
instruction inside the trap (push of a register, a direct jmp, jcc or call, a nop); any other is
copied out of line and single-stepped, a second exception, and costs about ten times as much
per hit. The symbol and its `ret`s cost a region over ten times what the two points chosen here
do, enough to show in a server's throughput (docs/results/ebpf-cost.md#where-the-region-probes-sit).

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

The code is decoded with capstone (returns.py), which also says what the kernel emulates. That is
claimed on x86-64 only: on aarch64 neither point is chosen, and the probes are the symbol and the
`ret`s, as they were when objdump's x86 mnemonics were matched there.
"""

from __future__ import annotations

from dataclasses import dataclass

from .code import (
    CALL,
    ENDBR,
    JUMP,
    RET,
    TABLE,
    TOOL_ERRORS,
    Instruction,
    disassemble,
    extent_at,
    symbol_address,
)


@dataclass(frozen=True)
class ProbePoint:
    address: int
    instruction: str  # as capstone prints it: "pushq %r13", "jne 0x1cb60"
    emulated: bool


def is_emulated(instruction: Instruction) -> bool:
    """Whether the kernel's x86 uprobe code runs this instruction inside the trap (decided as
    the instruction is decoded, returns.py; never on another architecture)."""
    return instruction.emulated


def _point(instruction: Instruction) -> ProbePoint:
    return ProbePoint(instruction.address, instruction.text, instruction.emulated)


def _code(path: str, address: int) -> tuple[tuple[int, int], list[Instruction]] | None:
    extent = extent_at(path, address)
    if extent is None:
        return None
    return extent, disassemble(path, *extent)


def entry_point(path: str, symbol: str) -> ProbePoint | None:
    """The instruction after `endbr64`, or the symbol's first where there is no endbr64, when
    the kernel emulates it; None: probe the symbol's start, single-stepped."""
    try:
        address = symbol_address(path, symbol)
        found = None if address is None else _code(path, address)
    except TOOL_ERRORS:
        return None
    if address is None or found is None:
        return None
    _, code = found
    at = [i for i, instruction in enumerate(code) if instruction.address == address]
    if not at or at[0] + 1 >= len(code):
        return None
    first, second = code[at[0]], code[at[0] + 1]
    if first.kind == ENDBR and is_emulated(second):
        return _point(second)
    if first.kind != ENDBR and is_emulated(first):
        return _point(first)  # the symbol's start itself (a build without CET)
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
    if any(instruction.kind == RET for instruction in code):
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
    for instruction in found[1]:
        if instruction.kind == CALL and instruction.target is not None:
            calls += 1
        elif instruction.kind in (JUMP, TABLE, RET, CALL):
            # The first block ends here: it must have waited on the barrier (a direct call) and
            # end in a branch the kernel emulates.
            if calls and instruction.kind == JUMP and is_emulated(instruction):
                return _point(instruction)
            return None
    return None


def _targets(code: list[Instruction], extent: tuple[int, int], calls: bool = True) -> list[int]:
    """Direct jump (and, with calls, call) targets outside the function."""
    kinds = (JUMP, CALL) if calls else (JUMP,)
    return [
        instruction.target
        for instruction in code
        if instruction.kind in kinds
        and instruction.target is not None
        and not extent[0] <= instruction.target < extent[1]
    ]
