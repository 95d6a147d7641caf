"""`profkit doctor` on this machine, as root: it passes, and says why where something is off."""

from __future__ import annotations

import json
import platform
import shutil

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
    # The region probes' places are read in-process (pyelftools, capstone): no binutils check.
    assert "binutils" not in checks
    readers = checks["pyelftools, capstone"]
    assert readers["status"] == (OK if platform.machine() in ("x86_64", "aarch64") else UNSUPPORTED)
    perf = shutil.which("perf")
    if perf is None:
        assert checks["perf"]["status"] == MISSING
        return
    # What perf's counts make of the hardware counters is tested on known counts in
    # tests/unit/test_doctor.py; as root, every software event counts.
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
