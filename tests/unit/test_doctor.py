"""`profkit doctor`: probes agree with the machine, and every missing path gives a reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit.host import capabilities, distro, tools
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
    debian = distro.current(DEBIAN_12, kernel="6.1.0-28-cloud-amd64")
    perf = capabilities.check_perf(debian)
    assert [c.status for c in perf] == [MISSING] and perf[0].fix == "apt-get install linux-perf"
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
    """In this checkout on Debian the fix is the setup that links Debian's headers; installed
    from a wheel, or on Ubuntu, it is the distribution's package for the running kernel."""
    release = "0.0.0-no-such-kernel"
    debian = distro.current(DEBIAN_12, kernel=release)
    check = capabilities.check_kernel_headers(release=release, here=debian)
    if check.status == OK:  # CONFIG_IKHEADERS makes every release fine
        pytest.skip("this kernel carries its own headers (CONFIG_IKHEADERS)")
    assert check.status == MISSING
    assert "Unable to find kernel headers" in check.detail
    assert distro.checkout() is not None  # the tests run from the checkout
    assert "make setup" in check.fix and "linux-headers-amd64" in check.fix
    ubuntu = distro.current(UBUNTU_2404, kernel=release)
    on_ubuntu = capabilities.check_kernel_headers(release=release, here=ubuntu)
    assert on_ubuntu.fix == f"apt-get install linux-headers-{release}"


# The os-release files these distributions ship, as they ship them (quoting included).
DEBIAN_12 = """PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
"""
UBUNTU_2404 = """PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble
"""
ROCKY_9 = """NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.4"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
"""
MINT_21 = """NAME="Linux Mint"
ID=linuxmint
ID_LIKE="ubuntu debian"
PRETTY_NAME="Linux Mint 21.3"
"""
# Only Debian has these names; Ubuntu's perf is per kernel and its headers metapackage is
# linux-headers-generic.
DEBIAN_ONLY = ("linux-perf", "linux-headers-amd64")


@pytest.mark.parametrize(
    ("text", "family", "perf", "bcc", "headers"),
    [
        (DEBIAN_12, "debian", "apt-get install linux-perf", "bpfcc-tools", "linux-headers-K"),
        (UBUNTU_2404, "ubuntu", "apt-get install linux-tools-K", "bpfcc-tools", "headers-K"),
        (MINT_21, "ubuntu", "apt-get install linux-tools-K", "bpfcc-tools", "headers-K"),
        (ROCKY_9, "rhel", "dnf install perf", "dnf install bcc-tools", "kernel-devel-K"),
        ("", "other", "install perf", "not PyPI's bcc", "headers of K"),
    ],
)
def test_each_distribution_gets_its_own_package_names(
    text: str, family: str, perf: str, bcc: str, headers: str
) -> None:
    here = distro.current(text, kernel="K")
    assert here.family == family
    assert here.install("perf").startswith(perf)
    assert bcc in here.install("bcc")
    assert here.install("headers").endswith(headers)
    if family != "debian":
        fixes = " ".join(here.install(need) for need in ("perf", "bcc", "headers"))
        assert not any(name in fixes for name in DEBIAN_ONLY), fixes


def test_os_release_quoting_and_names() -> None:
    fields = distro.parse_os_release(ROCKY_9 + "# a comment\nEMPTY=\nBAD LINE\n")
    assert fields["ID"] == "rocky" and fields["ID_LIKE"] == "rhel centos fedora"
    assert fields["EMPTY"] == "" and "BAD LINE" not in fields
    assert distro.current(UBUNTU_2404).name == "Ubuntu 24.04.1 LTS"
    assert distro.current("").name == "an unnamed distribution"


def test_an_installed_package_offers_no_make_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a checkout there is no Makefile to run: the Debian fix is the package itself."""
    monkeypatch.setattr(distro, "checkout", lambda: None)
    debian = distro.current(DEBIAN_12, kernel="6.1.0-28-cloud-amd64")
    fix = capabilities.headers_fix(debian, Path("/lib/modules/x/build"))
    assert fix == "apt-get install linux-headers-6.1.0-28-cloud-amd64"
    assert "make setup" not in capabilities.check_distro(debian).detail
    assert "an installed package" in capabilities.check_distro(debian).detail


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
    """capstone (with profkit's own ELF reader) replaces binutils: its absence, or a machine
    whose code is not decoded, is a warning with the uretprobe fallback, never a failure."""
    assert capabilities.check_code_readers in capabilities.CHECKS
    assert not hasattr(capabilities, "check_binutils")
    check = capabilities.check_code_readers("x86_64")
    assert check.status == OK and not check.core
    assert "capstone " in check.detail
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
    assert "pip install capstone" in missing.fix


def test_what_only_bcc_uses_is_not_needed_only_where_core_loads() -> None:
    def checks(core: CheckStatus) -> list[Check]:
        return [
            Check("kernel headers", MISSING, "no build link", "make setup"),
            Check("bcc", MISSING, "bcc is not installed", "apt-get install bpfcc-tools"),
            Check("CO-RE", core, "profkit's own loader loaded"),
            Check("tracefs", OK, "/sys/kernel/tracing"),
            Check("perf", MISSING, "not found", "apt-get install linux-perf"),
        ]

    settled = {c.name: c for c in settle_loaders(checks(OK))}
    for name in ("kernel headers", "bcc"):
        assert settled[name].status == NOT_NEEDED
        assert settled[name].detail.startswith("CO-RE loads every program (only --ebpf-loader")
        assert settled[name].fix == ""  # nothing needs fixing: doctor lists no fix for it
    assert settled["tracefs"].status == OK  # found rows are left as they are
    assert settled["perf"].status == MISSING  # perf serves its own collectors
    assert settle_loaders(checks(MISSING)) == checks(MISSING)
