"""`profkit doctor` on this machine, as root: it passes, and says why where something is off."""

from __future__ import annotations

import json
import platform
import shutil

import pytest

from profkit.host.capabilities import MISSING, NOT_NEEDED, OK, UNSUPPORTED

from ..support import NO_BTF, run_profkit

pytestmark = pytest.mark.root


def doctor_json(env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    result = run_profkit("doctor", "--json", env=env, timeout=300)
    payload = json.loads(result.stdout)
    return result.returncode, {check["name"]: check for check in payload["checks"]}


def test_doctor_matches_the_machine() -> None:
    code, checks = doctor_json()
    assert code == 0 and checks["py-spy"]["status"] == OK
    # The region probes' places are read in-process (profkit's ELF reader, capstone): no
    # binutils check.
    assert "binutils" not in checks
    readers = checks["capstone"]
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
    # Neither loader can run: bcc disabled and a kernel without BTF for the CO-RE object.
    env = {"PROFKIT_DISABLE_BCC": "1"}
    result = run_profkit("doctor", env=env, timeout=300, hide=NO_BTF)
    assert "capability" in result.stdout and "bcc" in result.stdout
    assert "disabled by PROFKIT_DISABLE_BCC" in result.stdout
    fixes = result.stdout.split("to fix:", 1)[1]
    assert "bcc: apt-get install bpfcc-tools" in fixes, fixes
    assert "CO-RE: a kernel built with CONFIG_DEBUG_INFO_BTF=y" in fixes, fixes
    # bcc is not core: doctor still exits 0 without it.
    assert result.returncode == 0


def test_what_only_bcc_uses_is_not_needed_where_core_loads() -> None:
    code, checks = doctor_json({"PROFKIT_DISABLE_BCC": "1"})
    assert code == 0 and checks["CO-RE"]["status"] == OK, checks["CO-RE"]
    assert "profkit's own loader" in checks["CO-RE"]["detail"]
    bcc = checks["bcc"]
    assert bcc["status"] == NOT_NEEDED and not bcc["fix"], bcc
    assert "disabled by PROFKIT_DISABLE_BCC" in bcc["detail"]
    text = run_profkit("doctor", env={"PROFKIT_DISABLE_BCC": "1"}, timeout=300).stdout
    fixes = text.split("to fix:", 1)[1] if "to fix:" in text else ""
    assert "  bcc: " not in fixes, fixes
