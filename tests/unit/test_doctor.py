"""`profkit doctor`: probes agree with the machine, and every missing path gives a reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit.host import capabilities, tools
from profkit.host.capabilities import MISSING, OK

from ..support import run_profkit


def doctor_json(env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    result = run_profkit("doctor", "--json", env=env, timeout=300)
    payload = json.loads(result.stdout)
    return result.returncode, {check["name"]: check for check in payload["checks"]}


def test_missing_pyspy_is_core_and_exits_7(tmp_path) -> None:
    code, checks = doctor_json(env={"PROFKIT_PY_SPY": str(tmp_path / "absent")})
    assert checks["py-spy"]["status"] == MISSING and checks["py-spy"]["core"]
    assert "pip install py-spy" in checks["py-spy"]["fix"]
    assert code == 7


def test_missing_perf_has_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capabilities, "find_tool", lambda name: tools.Tool(name, None, None))
    perf = capabilities.check_perf()
    assert perf[0].status == MISSING and "linux-perf" in perf[0].fix


def test_missing_headers_explains_the_link() -> None:
    check = capabilities.check_kernel_headers(release="0.0.0-no-such-kernel")
    if check.status == OK:  # CONFIG_IKHEADERS makes every release fine
        pytest.skip("this kernel carries its own headers (CONFIG_IKHEADERS)")
    assert check.status == MISSING
    assert "Unable to find kernel headers" in check.detail
    assert "linux-headers-amd64" in check.fix and "-common" in check.fix


def test_paranoid_without_privilege() -> None:
    check = capabilities.check_paranoid(caps=0)
    level = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    assert check.status == (OK if level <= 1 else MISSING)


def test_capability_bits_parse() -> None:
    status = "Name:\tx\nCapEff:\t000000c000080000\n"
    caps = capabilities.effective_capabilities(status)
    assert caps >> 19 & 1 and caps >> 38 & 1 and caps >> 39 & 1 and not caps >> 21 & 1
