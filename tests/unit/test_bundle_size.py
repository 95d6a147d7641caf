"""--max-size holds for the bundle as it is left on disk, its final manifest included."""

from __future__ import annotations

import json
from pathlib import Path

from profkit.bundle.parts import EBPF, MANIFEST, PERF, PERF_DATA, PYSPY
from profkit.bundle.write import directory_size, finish_within


def _bundle(directory: Path) -> None:
    directory.mkdir()
    (directory / PERF_DATA).write_bytes(b"\0" * 40_000)
    slices = {"tid": list(range(3000)), "start_ns": list(range(3000))}
    (directory / EBPF).write_text(json.dumps({"regions": [1, 2, 3], "slices": slices}))
    (directory / PERF).write_text(json.dumps({"samples": ["x" * 50] * 200}))
    (directory / PYSPY).write_text(json.dumps({"samples": ["y" * 50] * 200}))


def _growing_manifest(degraded: list[str]) -> dict[str, object]:
    # Like the capture's: every part dropped adds its name and a status line for its owner.
    return {
        "schema_version": 1,
        "dropped_for_size": degraded,
        "notes": [f"{name} dropped to keep the bundle under --max-size " * 8 for name in degraded],
    }


def test_the_final_manifest_counts_towards_max_size(tmp_path: Path) -> None:
    _bundle(tmp_path / "b")
    without_perf_data = directory_size(tmp_path / "b") - 40_000
    # Just enough room once perf.data is gone, were the manifest not to grow: it does.
    bound = without_perf_data + len(json.dumps(_growing_manifest([]), indent=2)) + 10
    manifest = finish_within(tmp_path / "b", bound, _growing_manifest)
    assert directory_size(tmp_path / "b") <= bound
    assert manifest["dropped_for_size"][0] == PERF_DATA
    assert len(manifest["dropped_for_size"]) >= 2
    on_disk = json.loads((tmp_path / "b" / MANIFEST).read_text())
    assert on_disk == manifest


def test_nothing_goes_when_the_bundle_fits(tmp_path: Path) -> None:
    _bundle(tmp_path / "b")
    manifest = finish_within(tmp_path / "b", 10**9, _growing_manifest)
    assert manifest["dropped_for_size"] == []
    assert (tmp_path / "b" / PERF_DATA).exists()


def test_a_bound_below_what_cannot_go_keeps_the_manifest(tmp_path: Path) -> None:
    _bundle(tmp_path / "b")
    manifest = finish_within(tmp_path / "b", 10, _growing_manifest)
    assert (tmp_path / "b" / MANIFEST).exists()
    assert set(manifest["dropped_for_size"]) >= {PERF_DATA, PERF, PYSPY, EBPF}
