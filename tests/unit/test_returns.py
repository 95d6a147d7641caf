"""Return sites of the OpenMP fork entry point, found in torch's own bundled libgomp."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.capture.ebpf import returns

torch = pytest.importorskip("torch")
LIBGOMP = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))


@pytest.mark.skipif(not LIBGOMP, reason="this torch build bundles no libgomp")
def test_gomp_parallel_returns_are_found_through_its_tail_calls() -> None:
    path = str(LIBGOMP[0])
    sites = returns.return_sites(path, "GOMP_parallel")
    assert sites, "no return found"
    extents = returns.function_extents(path)
    entry = returns.symbol_address(path, "GOMP_parallel")
    assert entry is not None
    own = returns.extent_of(entry, extents)
    assert own is not None
    # GOMP_parallel ends in a jump to GOMP_parallel_end: its returns lie in other functions.
    assert all(not own[0] <= site < own[1] for site in sites)
    for site in sites:
        extent = returns.extent_of(site, extents)
        assert extent is not None
        instruction = dict(returns.disassemble(path, *extent))[site]
        assert instruction.split()[0] in ("ret", "retq"), instruction


def test_an_unknown_symbol_or_file_gives_no_answer(tmp_path: Path) -> None:
    assert returns.return_sites(str(LIBGOMP[0]) if LIBGOMP else "/bin/true", "no_such_fn") is None
    assert returns.return_sites(str(tmp_path / "missing.so"), "GOMP_parallel") is None
