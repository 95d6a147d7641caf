"""Cheap uprobe points for OpenMP regions, found in torch's bundled libgomp and Debian's."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.capture.ebpf.placement import code as returns
from profkit.capture.ebpf.placement import points as probe_points
from profkit.capture.ebpf.placement.regions import GOMP_ENTRIES

from .libgomps import BOTH, present
from .test_returns import known, openblas

# The points objdump's text gave in these builds (compared when profkit stopped using it): the
# entry of each GOMP_parallel* after its endbr64, and the branch after the team barrier.
POINTS = {
    "f9a9ad78a8dc39c0": {  # Debian 12's libgomp1
        "entries": [0x14074, 0x10B34, 0x10C04, 0x10DA4, 0x10E74, 0x14774],
        "end": probe_points.ProbePoint(0x1E305, "jne 0x1e3d0", True),
    },
    "78511033caddec6c": {  # torch 2.13.0's libgomp.so.1
        "entries": [0x116E4, 0xE914, 0xE954, 0xE994, 0xE9D4, 0x11D64],
        "end": probe_points.ProbePoint(0x1CAA5, "jne 0x1cb60", True),
    },
}


@pytest.mark.parametrize(
    ("code", "emulated"),
    [
        ("4155", True),  # push %r13
        ("55", True),  # push %rbp
        ("0f85f0000000", True),  # jne
        ("e9fb000000", True),  # jmp
        ("f2e9fb000000", True),  # bnd jmp
        ("e8fb000000", True),  # call
        ("0f1f4000", True),  # nopl 0x0(%rax)
        ("6690", True),  # xchg %ax,%ax (a nop)
        ("f30f1efa", False),  # endbr64
        ("c3", False),  # ret
        ("415f", False),  # pop %r15
        ("4889f5", False),  # mov %rsi,%rbp
        ("ffd3", False),  # call *%rbx
        ("ffe0", False),  # jmp *%rax
        ("ff7008", False),  # push 0x8(%rax)
        ("0fa0", False),  # push %fs
        ("e3fe", False),  # jrcxz: a branch the kernel steps
    ],
)
def test_which_instructions_the_kernel_emulates(code: str, emulated: bool) -> None:
    (instruction,) = returns.decode("EM_X86_64", bytes.fromhex(code), 0x1000)
    assert probe_points.is_emulated(instruction) is emulated, instruction


@pytest.mark.parametrize("library", BOTH)
def test_entry_point_is_the_emulated_instruction_after_endbr64(library: Path | None) -> None:
    path = present(library)
    symbol = returns.symbol_address(path, "GOMP_parallel")
    point = probe_points.entry_point(path, "GOMP_parallel")
    assert symbol is not None and point is not None
    extent = returns.extent_of(symbol, returns.function_extents(path))
    assert extent is not None
    code = returns.disassemble(path, *extent)
    assert (code[0].address, code[0].kind) == (symbol, returns.ENDBR)
    assert point.address == code[1].address and probe_points.is_emulated(code[1])
    assert point.instruction == code[1].text and point.emulated


@pytest.mark.parametrize("library", BOTH)
def test_region_end_is_a_branch_after_the_team_barrier_call(library: Path | None) -> None:
    path = present(library)
    point = probe_points.gomp_region_end(path)
    assert point is not None
    assert point.instruction.startswith("j") and point.emulated
    extent = returns.extent_of(point.address, returns.function_extents(path))
    assert extent is not None
    # It closes the first block of the function GOMP_parallel_end hands over to, after a call.
    code = returns.disassemble(path, *extent)
    before = [i for i in code if i.address < point.address]
    assert any(i.kind == returns.CALL for i in before)
    assert not any(i.kind in (returns.JUMP, returns.TABLE, returns.RET) for i in before)
    (chosen,) = [i for i in code if i.address == point.address]
    assert chosen.kind == returns.JUMP and probe_points.is_emulated(chosen)
    # And that function holds a way out of GOMP_parallel (a `ret`, or a tail call to free()).
    ends = returns.return_sites(path, "GOMP_parallel") or []
    assert any(extent[0] <= r < extent[1] for r in ends)
    # The barrier call is the function's first call, and GOMP_parallel never returns by itself.
    start = returns.symbol_address(path, "GOMP_parallel")
    assert start is not None
    own = returns.extent_of(start, returns.function_extents(path))
    assert own is not None and not any(own[0] <= r < own[1] for r in ends)


@pytest.mark.parametrize("library", BOTH)
def test_points_of_known_builds(library: Path | None) -> None:
    path = present(library)
    expected = known(path, POINTS)
    entries = [probe_points.entry_point(path, symbol) for symbol in GOMP_ENTRIES]
    assert [point.address if point else None for point in entries] == expected["entries"]
    assert all(
        point and point.emulated and point.instruction.startswith("push") for point in entries
    )
    assert probe_points.gomp_region_end(path) == expected["end"]


def test_openblas_has_no_cet_entry_and_no_team_barrier() -> None:
    """Built without endbr64: the entry probe sits on exec_blas's own first instruction, a push
    of a register, which the kernel emulates; no team barrier."""
    path = openblas()
    point = probe_points.entry_point(path, "exec_blas")
    assert point is not None and point.address == returns.symbol_address(path, "exec_blas")
    assert point.emulated and point.instruction.startswith("push")
    assert probe_points.gomp_region_end(path) is None


def test_other_code_gives_no_point(tmp_path: Path) -> None:
    assert probe_points.gomp_region_end("/bin/true") is None
    assert probe_points.entry_point(str(tmp_path / "missing.so"), "GOMP_parallel") is None
    assert probe_points.gomp_region_end(str(tmp_path / "missing.so")) is None


def test_a_region_traps_by_the_kind_of_instruction_each_probe_sits_on() -> None:
    """What a trap costs is measured by kind (capture/ebpf/costs.py): a region's entry counts as
    emulated only where every entry point is, its end only at the team barrier's branch."""
    from profkit.capture.ebpf.placement.regions import KINDS, Entry, RuntimeProbes
    from profkit.host.target import Runtime

    push = probe_points.ProbePoint(0x116E4, "pushq %r13", True)
    branch = probe_points.ProbePoint(0x1CB2C, "jne 0x1cb60", True)
    runtime = Runtime("libgomp", "/lib/libgomp.so.1")

    def probes(*entries: Entry, end: probe_points.ProbePoint | None) -> RuntimeProbes:
        return RuntimeProbes(0, runtime, KINDS["libgomp"], entries, end, ())

    emulated = Entry("GOMP_parallel", push.address, push)
    at_symbol = Entry("GOMP_parallel_loop_static", 0x1200, None)
    assert probes(emulated, end=branch).traps() == (True, True)
    assert probes(emulated, at_symbol, end=branch).traps() == (False, True)
    assert probes(emulated, end=None).traps() == (True, False)  # a `ret`: single-stepped
