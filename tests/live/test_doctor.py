"""`profkit doctor` on this machine, as root: it passes, and says why where something is off."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from profkit.host.capabilities import MISSING, OK, UNSUPPORTED

from ..support import run_profkit

pytestmark = pytest.mark.root


def doctor_json(env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    result = run_profkit("doctor", "--json", env=env, timeout=300)
    payload = json.loads(result.stdout)
    return result.returncode, {check["name"]: check for check in payload["checks"]}


def test_doctor_matches_the_machine() -> None:
    code, checks = doctor_json()
    assert code == 0 and checks["py-spy"]["status"] == OK
    perf = shutil.which("perf")
    if perf is None:
        assert checks["perf"]["status"] == MISSING
        return
    direct = subprocess.run(
        [perf, "stat", "-x,", "-e", "cycles", "--", "true"], capture_output=True, text=True
    )
    hardware_works = "<not supported>" not in direct.stderr and "<not counted>" not in direct.stderr
    expected = OK if hardware_works else UNSUPPORTED
    assert checks["perf hardware counters"]["status"] == expected
    assert checks["perf software events"]["status"] == OK
    # bcc "ok" must mean a program really compiled: the header link is what makes that work.
    if checks["kernel headers"]["status"] == OK and checks["CAP_BPF"]["status"] == OK:
        assert checks["bcc"]["status"] == OK, checks["bcc"]


def test_doctor_text_has_reasons_and_fixes() -> None:
    result = run_profkit("doctor", env={"PROFKIT_DISABLE_BCC": "1"}, timeout=300)
    assert "capability" in result.stdout and "bcc" in result.stdout
    assert "disabled by PROFKIT_DISABLE_BCC" in result.stdout
    assert "to fix:" in result.stdout
    # bcc is not core: doctor still exits 0 without it.
    assert result.returncode == 0
