"""Cheap uprobe points for OpenMP regions, found in torch's bundled libgomp and Debian's."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.capture.ebpf import probe_points, returns

from .libgomps import BOTH, present


@pytest.mark.parametrize(
    ("instruction", "emulated"),
    [
        ("push   %r13", True),
        ("push   %rbp", True),
        ("jne    1cb60 <omp_in_final@@OMP_3.1+0x1880>", True),
        ("jmp    11650 <GOMP_parallel_end@@GOMP_1.0>", True),
        ("call   1b6f0 <omp_in_final@@OMP_3.1+0x410>", True),
        ("nopl   0x0(%rax)", True),
        ("endbr64", False),
        ("ret", False),
        ("pop    %r15", False),
        ("mov    %rsi,%rbp", False),
        ("call   *%rbx", False),
        ("jmp    *%rax", False),
        ("push   0x8(%rax)", False),
    ],
)
def test_which_instructions_the_kernel_emulates(instruction: str, emulated: bool) -> None:
    assert probe_points.is_emulated(instruction) is emulated


@pytest.mark.parametrize("library", BOTH)
def test_entry_point_is_the_emulated_instruction_after_endbr64(library: Path | None) -> None:
    path = present(library)
    symbol = returns.symbol_address(path, "GOMP_parallel")
    point = probe_points.entry_point(path, "GOMP_parallel")
    assert symbol is not None and point is not None
    extent = returns.extent_of(symbol, returns.function_extents(path))
    assert extent is not None
    code = returns.disassemble(path, *extent)
    assert code[0] == (symbol, "endbr64")
    assert point.address == code[1][0] and probe_points.is_emulated(point.instruction)


@pytest.mark.parametrize("library", BOTH)
def test_region_end_is_a_branch_after_the_team_barrier_call(library: Path | None) -> None:
    path = present(library)
    point = probe_points.gomp_region_end(path)
    assert point is not None
    assert point.instruction.startswith("j") and probe_points.is_emulated(point.instruction)
    extent = returns.extent_of(point.address, returns.function_extents(path))
    assert extent is not None
    # It closes the first block of the function GOMP_parallel_end hands over to, after a call.
    before = [i for a, i in returns.disassemble(path, *extent) if a < point.address]
    assert any(i.startswith("call") for i in before)
    assert not any(i.startswith(("j", "ret")) for i in before)
    # And that function holds a way out of GOMP_parallel (a `ret`, or a tail call to free()).
    ends = returns.return_sites(path, "GOMP_parallel") or []
    assert any(extent[0] <= r < extent[1] for r in ends)
    # The barrier call is the function's first call, and GOMP_parallel never returns by itself.
    start = returns.symbol_address(path, "GOMP_parallel")
    assert start is not None
    own = returns.extent_of(start, returns.function_extents(path))
    assert own is not None and not any(own[0] <= r < own[1] for r in ends)


def test_other_code_gives_no_point(tmp_path: Path) -> None:
    assert probe_points.gomp_region_end("/bin/true") is None
    assert probe_points.entry_point(str(tmp_path / "missing.so"), "GOMP_parallel") is None
    assert probe_points.gomp_region_end(str(tmp_path / "missing.so")) is None


def test_a_hit_costs_what_was_measured_for_its_kind() -> None:
    push = probe_points.ProbePoint(0x116E4, "push   %r13")
    ret = probe_points.ProbePoint(0x1CB2C, "ret")
    assert probe_points.hit_cost_s(push) == probe_points.EMULATED_HIT_S
    assert probe_points.hit_cost_s(ret) == probe_points.STEPPED_HIT_S
    assert probe_points.hit_cost_s(None) == probe_points.STEPPED_HIT_S
    assert probe_points.EMULATED_HIT_S * 5 < probe_points.STEPPED_HIT_S
