"""The two libgomp builds the region-probe tests read: torch's bundled copy and Debian's."""

from __future__ import annotations

from pathlib import Path

import pytest

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
