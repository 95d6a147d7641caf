"""A non-editable build ships the eBPF programs inside the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from ..support import ROOT


def test_wheel_contains_probes(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    wheel = next(tmp_path.glob("profkit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    probes = sorted(p.name for p in (ROOT / "probes").glob("*.bpf.c"))
    assert probes, "the project has eBPF programs to ship"
    for probe in [*probes, "pywalk.h"]:  # the frame walk both loaders' programs include
        assert f"profkit/capture/ebpf/probes/{probe}" in names
    assert "profkit/cli.py" in names and "profkit/commands/doctor.py" in names
    assert "profkit/render/flame.js" in names  # the flame graph's script
    # pprof's schema and the code generated from it
    for name in ("profile.proto", "profile_pb2.py", "profile_pb2.pyi"):
        assert f"profkit/render/proto/{name}" in names
    # The prebuilt CO-RE object beside its one source, for nodes where bcc cannot compile; and
    # nothing the installed package would need from the node: no native library, no build step.
    for probe in probes:
        assert f"profkit/capture/ebpf/probes/{probe.removesuffix('.c')}.o" in names, probe
    assert not [n for n in names if n.endswith((".so", ".pyd"))], "a pure wheel"
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
