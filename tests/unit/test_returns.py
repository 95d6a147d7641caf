"""Return sites of the OpenMP fork entry point, found in torch's own bundled libgomp."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.capture.ebpf import returns

torch = pytest.importorskip("torch")
LIBGOMP = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
# Debian's libgomp1 (a dependency of gcc): GOMP_parallel_end is inlined into GOMP_parallel there,
# and gomp_team_end ends in a tail call to free() through the PLT.
SYSTEM_LIBGOMP = Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1")
BOTH = [
    pytest.param(LIBGOMP[0] if LIBGOMP else None, id="torch"),
    pytest.param(SYSTEM_LIBGOMP, id="debian"),
]


def present(path: Path | None) -> str:
    """The library's path; the Debian one is installed by scripts/setup.sh (gcc)."""
    if path is None:
        pytest.skip("this torch build bundles no libgomp")
    assert path.exists(), f"{path} missing: scripts/setup.sh --test installs gcc, which brings it"
    return str(path)


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
