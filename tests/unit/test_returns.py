"""Return sites of the OpenMP fork entry point, found in torch's bundled libgomp and Debian's."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.capture.ebpf import returns

from .libgomps import BOTH, LIBGOMP, SYSTEM_LIBGOMP, present


@pytest.mark.parametrize("library", BOTH)
def test_gomp_parallel_returns_are_found_through_its_tail_calls(library: Path | None) -> None:
    path = present(library)
    sites = returns.return_sites(path, "GOMP_parallel")
    assert sites, "no return found"
    extents = returns.function_extents(path)
    entry = returns.symbol_address(path, "GOMP_parallel")
    assert entry is not None
    own = returns.extent_of(entry, extents)
    assert own is not None
    # GOMP_parallel ends in a jump to GOMP_parallel_end: its returns lie in other functions.
    assert all(not own[0] <= site < own[1] for site in sites)
    plt = returns.plt_ranges(path)
    kinds = set()
    for site in sites:
        extent = returns.extent_of(site, extents)
        assert extent is not None
        instruction = dict(returns.disassemble(path, *extent))[site]
        if returns.is_return(instruction):
            kinds.add("ret")
        else:
            # A tail call out of the library: a direct jump into the PLT.
            target = returns.DIRECT_JUMP.match(instruction)
            assert target is not None, instruction
            assert returns.extent_of(int(target.group(1), 16), plt) is not None, instruction
            kinds.add("plt")
    assert "ret" in kinds
    if library == SYSTEM_LIBGOMP:
        assert "plt" in kinds  # gomp_team_end's `jmp free@plt`


def test_plt_sections_are_found() -> None:
    ranges = returns.plt_ranges(str(SYSTEM_LIBGOMP))
    assert ranges and all(start < end for start, end in ranges)
    assert returns.plt_ranges("/bin/true")  # every dynamically linked program has one


def test_an_unknown_symbol_or_file_gives_no_answer(tmp_path: Path) -> None:
    assert returns.return_sites(str(LIBGOMP[0]) if LIBGOMP else "/bin/true", "no_such_fn") is None
    assert returns.return_sites(str(tmp_path / "missing.so"), "GOMP_parallel") is None
