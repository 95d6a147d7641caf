"""benchmarks/probe_cost.py on this machine: it loads its probes into torch's own libgomp."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..support import ROOT

torch = pytest.importorskip("torch")
LIBGOMP = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
needs_libgomp = pytest.mark.skipif(not LIBGOMP, reason="this torch build bundles no libgomp")


@needs_libgomp
@pytest.mark.root
@pytest.mark.timeout(180)
def test_probe_cost_benchmark_prints_every_layout() -> None:
    """benchmarks/probe_cost.py on this machine: one line per probe layout, never a timing."""
    import subprocess
    import sys

    from profkit.capture.ebpf.loaders.bcc import BccUnavailable, load_bcc

    try:
        load_bcc()
    except BccUnavailable as exc:
        pytest.skip(f"bcc unavailable: {exc}")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.probe_cost", "--rounds", "1", "--seconds", "0.3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=True,
    )
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert [line.split(" probes:")[0].split()[:-1] for line in lines] == [
        ["symbol", "+", "each", "ret"],
        ["emulated", "points"],
        ["emulated", "+", "walker"],
    ]
    for line in lines:
        assert "us per region" in line and "ratio" in line


@needs_libgomp
@pytest.mark.root
@pytest.mark.timeout(180)
def test_probe_toggle_perf_pools_interleaved_rounds() -> None:
    """`python -m benchmarks.probe_toggle --perf` on a live recipe: one row per layout, its
    samples pooled over the rounds; the region program counts regions, the empty programs none."""
    import shutil
    import subprocess
    import sys

    from profkit.capture.ebpf.loaders.bcc import BccUnavailable, load_bcc

    try:
        load_bcc()
    except BccUnavailable as exc:
        pytest.skip(f"bcc unavailable: {exc}")
    if shutil.which("perf") is None:
        pytest.skip("perf not installed")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.probe_toggle",
            "--target",
            "fanout",
            "--threads",
            "2",
            "--warmup",
            "2",
            "--perf",
            "0.5",
            "--rounds",
            "2",
            "--layouts",
            "both,traps",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert any("2 round(s) of 0.5 s per layout" in line for line in lines)
    rows = {
        line.split()[0]: line.split() for line in lines if line.split()[:1] in (["both"], ["traps"])
    }
    assert set(rows) == {"both", "traps"}
    assert int(rows["both"][1].replace(",", "")) > 0  # regions/s while the entry probe is on
    assert rows["traps"][1] == "0"
