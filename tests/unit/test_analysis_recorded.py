"""Analysis on bundles recorded by profkit itself: fast, root-free, deterministic."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

from profkit.analysis.pipeline import analyse_bundle
from profkit.render.json_report import FindingJson, report_dict
from profkit.render.text import render_text

from ..support import DATA, run_profkit

REQUIRED: dict[Literal["target", "cpu", "quota"], set[str]] = {
    "target": {"pid", "cmdline", "threads", "openmp_runtime", "torch_threads"},
    "cpu": {"process_cores", "python_sampled_cores", "categories", "unexplained_cores", "threads"},
    "quota": {
        "effective_cores",
        "source",
        "throttled_periods_pct",
        "throttled_seconds",
        "usage_cores",
    },
}


def findings(name: str) -> dict[str, FindingJson]:
    return {f["id"]: f for f in report_dict(analyse_bundle(DATA / name))["findings"]}


def test_fanout_in_quota_is_diagnosed() -> None:
    report = report_dict(analyse_bundle(DATA / "fanout_quota"))
    found = {f["id"]: f for f in report["findings"]}
    assert found["cpu-fanout"]["evidence"]["op"] == "aten::copy_"
    assert found["cpu-fanout"]["evidence"]["function"] == "copy_with_torch"
    assert found["quota-oversubscription"]["evidence"]["recommended_threads"] == 1
    assert report["quota"] is not None
    assert report["quota"]["effective_cores"] == pytest.approx(0.5)
    throttled_pct = report["quota"]["throttled_periods_pct"]
    assert throttled_pct is not None and throttled_pct > 50
    assert report["cpu"]["closure_pct"] <= 3.0
    # The pool is the process's largest consumer and py-spy sees only the main thread.
    categories = report["cpu"]["categories"]
    assert categories["pool_workers"] > report["cpu"]["python_sampled_cores"] * 0.5
    assert report["pools"][0]["team_size"] == 8


def test_numpy_copy_has_no_fanout() -> None:
    assert "cpu-fanout" not in findings("numpy_copy")


def test_two_sites_attribution() -> None:
    report = report_dict(analyse_bundle(DATA / "two_sites"))
    shares = {row["function"]: row["share"] for row in report["attribution"]}
    # copy_single copies with one thread (torch.set_num_threads(1)): no pool CPU is its.
    assert shares == {"copy_fanout": pytest.approx(1.0)}


@pytest.mark.parametrize("name", ["fanout_quota", "numpy_copy", "two_sites"])
def test_json_contract(name: str) -> None:
    report = report_dict(analyse_bundle(DATA / name))
    assert report["schema_version"] == 1
    for section, keys in REQUIRED.items():
        part = report[section]
        if part is not None:
            assert keys <= set(part), (section, keys - set(part))
    assert set(report["cpu"]["categories"]) == {
        "python",
        "native_in_python_threads",
        "pool_workers",
        "other",
    }
    for pool in report["pools"]:
        assert {"runtime", "workers", "cores", "regions", "activity"} <= set(pool)
    for row in report["attribution"]:
        assert {"site", "function", "op", "pool_cores", "share"} <= set(row)
    for finding in report["findings"]:
        assert {"id", "severity", "summary", "evidence", "fix"} == set(finding)
        assert finding["evidence"], "no finding without evidence"
    json.dumps(report)


@pytest.mark.parametrize("name", ["fanout_quota", "numpy_copy", "two_sites"])
def test_text_fits_80_columns(name: str) -> None:
    text = render_text(analyse_bundle(DATA / name))
    assert text.splitlines()[3] == "VERDICT"
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert not too_wide, too_wide


def test_report_cli_without_root_flags(tmp_path: Path) -> None:
    result = run_profkit("report", str(DATA / "fanout_quota"), "--format", "json")
    assert result.returncode == 0, result.stderr
    # Both high; findings of one severity keep the order analysis finds them in, fan-out first.
    assert [f["id"] for f in json.loads(result.stdout)["findings"]] == [
        "cpu-fanout",
        "quota-oversubscription",
        "python-blind-spot",
    ]


def test_missing_collector_is_not_a_zero(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(DATA / "fanout_quota", bundle)
    (bundle / "ebpf.json").unlink()
    (bundle / "perf.json").unlink()
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["collectors"]["ebpf"] = {"status": "unavailable", "reason": "no bcc"}
    manifest["collectors"]["perf_record"] = {"status": "unavailable", "reason": "no perf"}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    report = report_dict(analyse_bundle(bundle))
    assert report["not_captured"]["ebpf"] == "unavailable: no bcc"
    # Without perf and eBPF the pool is inferred from /proc alone (unnamed threads of a process
    # that maps libgomp), attributed by py-spy's native stacks in proportion, and said so.
    analysed = analyse_bundle(bundle)
    evidence = {r.evidence for r in analysed.roles if r.role == "pool-worker"}
    assert evidence and all(e.startswith("inferred from /proc") for e in evidence)
    assert report["pools"][0]["workers"] == 7
    notes = {n["pool"]: n for n in report["attribution_notes"]}
    assert notes["openmp"]["method"] == "proportional"
    found = {f["id"]: f for f in report["findings"]}
    assert found["cpu-fanout"]["evidence"]["function"] == "copy_with_torch"
    assert "quota-oversubscription" in found
    assert report["cpu"]["closure_pct"] <= 3.0


@pytest.mark.parametrize(
    ("loader", "line", "not_captured"),
    [
        (
            {"name": "core", "version": "libbpf 1.1", "reason": "auto: the kernel has BTF"},
            "eBPF through CO-RE (libbpf 1.1): auto: the kernel has BTF",
            None,
        ),
        (
            {"name": "bcc", "version": "bcc 0.26.0", "reason": "auto: no BTF (x)"},
            "eBPF through bcc (bcc 0.26.0): auto: no BTF (x)",
            "no BTF (x); bcc ran instead",
        ),
        (
            {"name": "bcc", "version": "bcc 0.26.0", "reason": "asked for (--ebpf-loader bcc)"},
            "eBPF through bcc (bcc 0.26.0): asked for (--ebpf-loader bcc)",
            None,
        ),
    ],
)
def test_the_report_names_the_loader_and_why(
    tmp_path: Path, loader: dict[str, str], line: str, not_captured: str | None
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(DATA / "fanout_quota", bundle)
    ebpf = json.loads((bundle / "ebpf.json").read_text())
    ebpf["loader"] = loader
    (bundle / "ebpf.json").write_text(json.dumps(ebpf))
    analysed = analyse_bundle(bundle)
    assert line in " ".join(render_text(analysed).split())
    assert report_dict(analysed)["not_captured"].get("ebpf prebuilt CO-RE program") == (
        not_captured
    )


def test_a_status_the_format_does_not_know_is_a_bad_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(DATA / "fanout_quota", bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["collectors"]["ebpf"]["status"] = "fine"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    result = run_profkit("report", str(bundle))
    assert result.returncode == 8, result.stderr
    assert "collectors.ebpf.status is 'fine', not one of ok" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: (b / "manifest.json").unlink(), "has no manifest.json"),
        (lambda b: (b / "manifest.json").write_text("{not json"), "not valid JSON"),
        (
            lambda b: (b / "proc.json").write_text(
                (DATA / "fanout_quota/proc.json").read_text()[:500]
            ),
            "truncated or corrupt",
        ),
        (lambda b: (b / "manifest.json").write_text('{"schema_version": 99}'), "schema 99"),
    ],
)
def test_bad_bundles_get_one_line_and_exit_8(
    tmp_path: Path, damage: Callable[[Path], object], message: str
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(DATA / "fanout_quota", bundle)
    damage(bundle)
    result = run_profkit("report", str(bundle))
    assert result.returncode == 8, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


def test_report_on_a_file_not_a_bundle(tmp_path: Path) -> None:
    result = run_profkit("report", str(tmp_path / "nothing-here"))
    assert result.returncode == 8 and "not a bundle directory" in result.stderr
