"""The hostile tester's cases that need no process of the test's own: numbers that are not
numbers, links planted where reports and exports go, recorded bundles damaged or aborted."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from profkit.errors import EXIT_BAD_BUNDLE, EXIT_USAGE

from ..support import DATA, SYSTEM_PYTHON, one_line, profkit

RECORDED = DATA / "fanout_quota"
OUTPUTS = {
    "report": ["report", str(RECORDED), "--format", "json", "-o"],
    "flame": ["flame", str(RECORDED), "-o"],
    "timeline": ["timeline", str(RECORDED), "-o"],
    "export": ["export", str(RECORDED), "--format", "pprof", "-o"],
}


def test_run_with_a_bad_number_never_starts_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    result = profkit(
        "run",
        "--duration",
        "nan",
        "--",
        SYSTEM_PYTHON,
        "-c",
        f"open({str(marker)!r}, 'w')",
        env={"PROFKIT_RUN_DIR": str(tmp_path / "run")},
    )
    assert result.returncode == EXIT_USAGE, result.stderr
    one_line(result)
    time.sleep(0.2)
    assert not marker.exists()


@pytest.mark.parametrize("command", list(OUTPUTS))
def test_reports_and_exports_are_owner_only_and_replace_a_planted_link(
    command: str, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    victim.chmod(0o644)
    out = tmp_path / "out"
    out.symlink_to(victim)
    result = profkit(*OUTPUTS[command], str(out))
    assert result.returncode == 0, result.stderr
    assert not out.is_symlink() and out.stat().st_size > 0
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert victim.read_bytes() == b"victim" and victim.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    shared = profkit(*OUTPUTS[command], str(tmp_path / "shared"), "--mode", "644")
    assert shared.returncode == 0, shared.stderr
    assert oct((tmp_path / "shared").stat().st_mode & 0o777) == "0o644"


def test_a_mode_that_is_not_octal_is_a_usage_error(tmp_path: Path) -> None:
    result = profkit(*OUTPUTS["flame"], str(tmp_path / "f.svg"), "--mode", "9")
    assert result.returncode == EXIT_USAGE
    assert "not an octal mode" in one_line(result)
    assert list(tmp_path.iterdir()) == []


def recorded_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(RECORDED, copy)
    return copy


def test_a_null_collector_file_is_a_bad_bundle_not_a_missing_one(tmp_path: Path) -> None:
    bundle = recorded_copy(tmp_path)
    (bundle / "perf.json").write_text("null")
    result = profkit("report", str(bundle))
    assert result.returncode == EXIT_BAD_BUNDLE, result.stderr
    assert "perf.json holds null" in one_line(result)


def test_an_aborted_bundle_reports_aborted(tmp_path: Path) -> None:
    bundle = recorded_copy(tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.update(status="aborted", status_reason="a write failed: No space left on device")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    text = profkit("report", str(bundle))
    assert text.returncode == 0, text.stderr
    assert "status aborted (a write failed: No space left on device)" in text.stdout
    manifest["window"] = {}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    (bundle / "proc.json").unlink()
    result = profkit("report", str(bundle))
    assert result.returncode == EXIT_BAD_BUNDLE, result.stderr
    assert "is aborted: a write failed: No space left on device" in one_line(result)
