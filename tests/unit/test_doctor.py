"""`profkit doctor`: probes agree with the machine, and every missing path gives a reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit.host import capabilities, tools
from profkit.host.capabilities import (
    MISSING,
    NOT_NEEDED,
    OK,
    UNSUPPORTED,
    Check,
    CheckStatus,
    settle_loaders,
)

from ..support import run_profkit


def doctor_json(env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    result = run_profkit("doctor", "--json", env=env, timeout=300)
    payload = json.loads(result.stdout)
    return result.returncode, {check["name"]: check for check in payload["checks"]}


def test_missing_pyspy_is_core_and_exits_7(tmp_path: Path) -> None:
    code, checks = doctor_json(env={"PROFKIT_PY_SPY": str(tmp_path / "absent")})
    assert checks["py-spy"]["status"] == MISSING and checks["py-spy"]["core"]
    assert "pip install py-spy" in checks["py-spy"]["fix"]
    assert code == 7


# A perf whose counts are known: `perf stat -x, -e EVENTS -- true` prints one CSV line per event
# on stderr, hardware events as $HARDWARE says (a count, or <not supported> as on a VM).
FAKE_PERF = """#!/bin/sh
for event in $(echo "$4" | tr , ' '); do
    case $event in
        cycles|instructions) echo "$HARDWARE,,$event,0,100.00,," >&2 ;;
        *) echo "12,,$event,1000,100.00,," >&2 ;;
    esac
done
"""


def test_perf_checks_follow_what_perf_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(capabilities, "find_tool", lambda name: tools.Tool(name, None, None))
    perf = capabilities.check_perf()
    assert [c.status for c in perf] == [MISSING] and "linux-perf" in perf[0].fix
    fake = tmp_path / "perf"
    fake.write_text(FAKE_PERF)
    fake.chmod(0o755)
    monkeypatch.setattr(capabilities, "find_tool", lambda name: tools.Tool(name, str(fake), (6,)))
    statuses = {}
    for hardware in ("<not supported>", "1234"):
        monkeypatch.setenv("HARDWARE", hardware)
        statuses[hardware] = {c.name: c.status for c in capabilities.check_perf()}
    assert statuses["<not supported>"] == {
        "perf": OK,
        "perf software events": OK,
        "perf hardware counters": UNSUPPORTED,
    }
    assert statuses["1234"] == {
        "perf": OK,
        "perf software events": OK,
        "perf hardware counters": OK,
    }


def test_missing_headers_explains_the_link() -> None:
    check = capabilities.check_kernel_headers(release="0.0.0-no-such-kernel")
    if check.status == OK:  # CONFIG_IKHEADERS makes every release fine
        pytest.skip("this kernel carries its own headers (CONFIG_IKHEADERS)")
    assert check.status == MISSING
    assert "Unable to find kernel headers" in check.detail
    assert "linux-headers-amd64" in check.fix and "-common" in check.fix


def test_paranoid_level_against_privilege(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setting = tmp_path / "perf_event_paranoid"
    monkeypatch.setattr(capabilities, "Path", lambda path: setting)
    perfmon = 1 << capabilities.CAPABILITY_BITS["CAP_PERFMON"]
    admin = 1 << capabilities.CAPABILITY_BITS["CAP_SYS_ADMIN"]
    for level, caps, status in (
        ("-1", 0, OK),
        ("1", 0, OK),
        ("2", 0, MISSING),
        ("4", 0, MISSING),
        ("2", perfmon, OK),
        ("2", admin, OK),
    ):
        setting.write_text(f"{level}\n")
        assert capabilities.check_paranoid(caps=caps).status == status, (level, caps)
    setting.write_text("2\n")
    refused = capabilities.check_paranoid(caps=0)
    assert refused.detail == "2: unprivileged users cannot sample other processes"
    assert refused.fix == "sysctl kernel.perf_event_paranoid=1, or grant CAP_PERFMON"


def test_capability_bits_parse() -> None:
    status = "Name:\tx\nCapEff:\t000000c000080000\n"
    caps = capabilities.effective_capabilities(status)
    assert caps >> 19 & 1 and caps >> 38 & 1 and caps >> 39 & 1 and not caps >> 21 & 1


def test_code_readers_check_imports_the_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyelftools and capstone replace binutils: their absence, or a machine whose code is not
    decoded, is a warning with the uretprobe fallback, never a failure."""
    assert capabilities.check_code_readers in capabilities.CHECKS
    assert not hasattr(capabilities, "check_binutils")
    check = capabilities.check_code_readers("x86_64")
    assert check.status == OK and not check.core
    assert "pyelftools " in check.detail and "capstone " in check.detail
    unsupported = capabilities.check_code_readers("ppc64le")
    assert unsupported.status == UNSUPPORTED and "only x86-64 and aarch64" in unsupported.detail
    real_import = capabilities.importlib.import_module

    def no_capstone(name: str) -> object:
        if name == "capstone":
            raise ImportError("ERROR: fail to load the dynamic library.")
        return real_import(name)

    monkeypatch.setattr(capabilities.importlib, "import_module", no_capstone)
    missing = capabilities.check_code_readers("x86_64")
    assert missing.status == capabilities.WARN and not missing.core
    assert "capstone (ERROR: fail to load" in missing.detail and "uretprobe" in missing.detail
    assert "pip install pyelftools capstone" in missing.fix


def test_what_only_bcc_uses_is_not_needed_only_where_core_loads() -> None:
    def checks(core: CheckStatus) -> list[Check]:
        return [
            Check("kernel headers", MISSING, "no build link", "make setup"),
            Check("bcc", MISSING, "bcc is not installed", "apt-get install bpfcc-tools"),
            Check("CO-RE (libbpf)", core, "libbpf 1.1 loaded"),
            Check("tracefs", OK, "/sys/kernel/tracing"),
            Check("perf", MISSING, "not found", "apt-get install linux-perf"),
        ]

    settled = {c.name: c for c in settle_loaders(checks(OK))}
    for name in ("kernel headers", "bcc"):
        assert settled[name].status == NOT_NEEDED
        assert settled[name].detail.startswith("CO-RE loads every program; ")
    assert settled["bcc"].fix == "apt-get install bpfcc-tools"  # for --ebpf-loader bcc
    assert settled["tracefs"].status == OK  # found rows are left as they are
    assert settled["perf"].status == MISSING  # perf serves its own collectors
    assert settle_loaders(checks(MISSING)) == checks(MISSING)
