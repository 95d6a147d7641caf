"""What this machine lets profkit do: each capability probed for real, with a reason and a fix."""

from __future__ import annotations

import contextlib
import gzip
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from . import distro as distros
from .cgroup import MOUNTINFO, parse_mountinfo
from .tools import find_tool

CheckStatus = Literal["ok", "missing", "unsupported", "warn", "not needed"]
OK: CheckStatus = "ok"
MISSING: CheckStatus = "missing"
UNSUPPORTED: CheckStatus = "unsupported"
WARN: CheckStatus = "warn"
NOT_NEEDED: CheckStatus = "not needed"  # missing, but what it serves runs another way
# What only bcc's loader uses: where the prebuilt CO-RE object loads, their absence costs nothing.
BCC_ONLY = ("kernel headers", "bcc", "tracefs")
CORE_CHECK = "CO-RE"
CAPABILITY_BITS = {"CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21, "CAP_PERFMON": 38, "CAP_BPF": 39}
SOFTWARE_EVENTS = ("task-clock", "context-switches", "cpu-migrations", "page-faults")
HARDWARE_EVENTS = ("cycles", "instructions")
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
SETUP_FIX = "make setup (or scripts/setup.sh as root)"
NO_BTF_FIX = "a kernel built with CONFIG_DEBUG_INFO_BTF=y (no package adds BTF to a kernel)"


def check_distro(here: distros.Distro | None = None) -> Check:
    """Which distribution the fixes below are written for."""
    here = here or distros.current()
    where = "a source checkout" if distros.checkout() else "an installed package"
    return Check("distribution", OK, f"{here.name} ({here.family} package names); {where}")


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str = ""
    core: bool = False  # without it profkit cannot capture anything useful

    @property
    def passed(self) -> bool:
        return self.status == OK

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def effective_capabilities(status_text: str | None = None) -> int:
    text = status_text if status_text is not None else Path("/proc/self/status").read_text()
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privileges() -> list[Check]:
    caps = effective_capabilities()
    checks = [
        Check(
            "root",
            OK if os.geteuid() == 0 else WARN,
            f"euid {os.geteuid()}",
            "" if os.geteuid() == 0 else "run as root (sudo)",
        )
    ]
    uses = {
        "CAP_SYS_PTRACE": "py-spy reads other processes' memory",
        "CAP_PERFMON": "perf samples other processes",
        "CAP_BPF": "eBPF programs load",
        "CAP_SYS_ADMIN": "eBPF and uprobes on older kernels",
    }
    for name, bit in CAPABILITY_BITS.items():
        held = bool(caps >> bit & 1)
        checks.append(
            Check(
                name,
                OK if held else MISSING,
                f"{'held' if held else 'not held'}: {uses[name]}",
                "" if held else f"grant it (docker: --cap-add {name[4:]})",
                core=name == "CAP_SYS_PTRACE",
            )
        )
    return checks


def check_paranoid(caps: int | None = None) -> Check:
    try:
        level = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        return Check("perf_event_paranoid", MISSING, "perf events not available in this kernel")
    caps = effective_capabilities() if caps is None else caps
    privileged = bool(caps >> CAPABILITY_BITS["CAP_PERFMON"] & 1) or bool(
        caps >> CAPABILITY_BITS["CAP_SYS_ADMIN"] & 1
    )
    if privileged or level <= 1:
        return Check("perf_event_paranoid", OK, f"{level} (enough for per-process sampling)")
    return Check(
        "perf_event_paranoid",
        MISSING,
        f"{level}: unprivileged users cannot sample other processes",
        "sysctl kernel.perf_event_paranoid=1, or grant CAP_PERFMON",
    )


def check_ptrace_scope() -> Check:
    path = Path("/proc/sys/kernel/yama/ptrace_scope")
    if not path.exists():
        return Check("ptrace_scope", OK, "no Yama LSM: ptrace follows capabilities")
    scope = path.read_text().strip()
    if scope == "3":
        return Check("ptrace_scope", MISSING, "3: ptrace disabled until reboot", "reboot", True)
    return Check("ptrace_scope", OK, f"{scope}")


def check_pyspy() -> Check:
    tool = find_tool("py-spy")
    if tool.path is None:
        return Check("py-spy", MISSING, "not found", "pip install py-spy", core=True)
    if not tool.usable:
        return Check(
            "py-spy",
            MISSING,
            f"{tool.version_text} at {tool.path} is too old",
            "pip install -U py-spy",
            core=True,
        )
    return Check("py-spy", OK, f"{tool.version_text} at {tool.path}", core=True)


def probe_perf_events(perf: str, events: tuple[str, ...]) -> dict[str, bool]:
    """Count each event over `true`; perf prints <not supported> for what the PMU lacks."""
    try:
        out = subprocess.run(
            [perf, "stat", "-x,", "-e", ",".join(events), "--", "true"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return dict.fromkeys(events, False)
    supported = dict.fromkeys(events, False)
    for line in out.stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in supported:
            supported[fields[2]] = not fields[0].startswith("<not")
    return supported


def check_perf(here: distros.Distro | None = None) -> list[Check]:
    tool = find_tool("perf")
    if tool.path is None:
        here = here or distros.current()
        return [Check("perf", MISSING, "not found", here.install("perf"))]
    checks = [Check("perf", OK, f"{tool.version_text} at {tool.path}")]
    software = probe_perf_events(tool.path, SOFTWARE_EVENTS)
    working = [e for e, ok in software.items() if ok]
    checks.append(
        Check(
            "perf software events",
            OK if len(working) == len(software) else MISSING,
            ", ".join(working) or "none count",
            "" if working else "check perf_event_paranoid and CAP_PERFMON",
        )
    )
    hardware = probe_perf_events(tool.path, HARDWARE_EVENTS)
    counted = [e for e, ok in hardware.items() if ok]
    if counted:
        checks.append(Check("perf hardware counters", OK, ", ".join(counted)))
    else:
        checks.append(
            Check(
                "perf hardware counters",
                UNSUPPORTED,
                "cycles/instructions <not supported> (no PMU exposed, e.g. a VM): "
                "profkit uses software events only",
            )
        )
    return checks


def headers_fix(here: distros.Distro, build: Path) -> str:
    """A checkout's setup links Debian's headers where the running kernel has no package of
    its own; elsewhere the distribution's package is the fix."""
    if here.family == "debian" and distros.checkout():
        return (
            f"{SETUP_FIX}: installs linux-headers-amd64 and links {build} to "
            "the -amd64 tree and source/ to the -common tree"
        )
    return here.install("headers")


def check_kernel_headers(release: str | None = None, here: distros.Distro | None = None) -> Check:
    release = release or platform.release()
    here = here or distros.current(kernel=release)
    build = Path("/lib/modules") / release / "build"
    if (build / "include").exists():
        return Check("kernel headers", OK, f"{build} -> {build.resolve()}")
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        return Check("kernel headers", OK, "CONFIG_IKHEADERS (/sys/kernel/kheaders.tar.xz)")
    return Check(
        "kernel headers",
        MISSING,
        f"no {build} and no CONFIG_IKHEADERS: bcc fails with 'Unable to find kernel headers'",
        headers_fix(here, build),
    )


BCC_PROBE = (
    "from profkit.capture.ebpf.loaders.bcc import load_bcc\n"
    "b = load_bcc().BPF(text='TRACEPOINT_PROBE(sched, sched_switch) { return 0; }')\n"
    "b.cleanup()\n"
    "print('bcc-ok')\n"
)


def check_bcc(here: distros.Distro | None = None) -> Check:
    """Import bcc AND compile and load a tracepoint program: the real test of kernel headers."""
    here = here or distros.current()
    build = Path("/lib/modules") / here.kernel / "build"
    try:
        out = subprocess.run(
            [sys.executable, "-c", BCC_PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    except subprocess.TimeoutExpired:
        return Check(
            "bcc", MISSING, "compiling a trivial program took over 120 s", headers_fix(here, build)
        )
    text = out.stdout + out.stderr
    if "bcc-ok" in out.stdout:
        return Check("bcc", OK, "imported, compiled and loaded a sched_switch tracepoint program")
    if "BccUnavailable" in text or "not installed" in text:
        reason = text.strip().splitlines()[-1].split(":", 1)[-1].strip()
        return Check("bcc", MISSING, reason, here.install("bcc"))
    if "Unable to find kernel headers" in text:
        return Check(
            "bcc",
            MISSING,
            "imported, but cannot compile: Unable to find kernel headers",
            headers_fix(here, build),
        )
    last = text.strip().splitlines()[-1] if text.strip() else f"exit {out.returncode}"
    return Check(
        "bcc",
        MISSING,
        f"compile/load failed: {last[:160]}",
        "run as root with CAP_BPF; see docs/install.md#permissions",
    )


CORE_PROBE = (
    "import os\n"
    "from profkit.capture.ebpf import program\n"
    "from profkit.capture.ebpf.loaders import LoadRequest\n"
    "from profkit.capture.ebpf.loaders import core\n"
    "why = core.readiness()\n"
    "if why: raise SystemExit('core-missing: ' + why)\n"
    "p = core.load_core(LoadRequest(os.getpid(), None, program.COUNTERS_ONLY, 0))\n"
    "record = p.record('')\n"
    "p.close(wait=True)\n"
    "print('core-ok', record['version'])\n"
)


def check_core() -> Check:
    """Load the prebuilt CO-RE process program through profkit's own loader: what runs where
    bcc cannot compile. The kernel checks each program's helpers as it loads (the region
    probes' attach cookies need 5.15), so a load that succeeds is the features check."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", CORE_PROBE], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return Check(CORE_CHECK, MISSING, "loading the process program took over 60 s")
    text = (out.stdout + out.stderr).strip()
    if out.stdout.startswith("core-ok"):
        version = out.stdout.strip().removeprefix("core-ok").strip()
        loaded = f"{version} loaded the prebuilt sampler, walker and region probes"
        return Check(CORE_CHECK, OK, loaded)
    last = text.splitlines()[-1] if text else f"exit {out.returncode}"
    if "core-missing:" in last:
        reason = last.split("core-missing:", 1)[1].strip()
        fix = NO_BTF_FIX if "BTF" in reason else ""
        return Check(CORE_CHECK, MISSING, reason, fix)
    return Check(CORE_CHECK, MISSING, f"load failed: {last[:160]}", "run as root with CAP_BPF")


def check_python_target(pid: int) -> Check:
    """The target's interpreter as the eBPF walker finds it: version, build, where its layout
    comes from, and whether the walker passes its self-check there."""
    from .pyruntime import PyRuntimeUnsupported, detect, self_check

    name = f"python (pid {pid})"
    try:
        layout = detect(pid)
    except PyRuntimeUnsupported as exc:
        return Check(name, UNSUPPORTED, f"{exc}: py-spy samples it instead")
    found = f"Python {layout.version_text}, {layout.build}, layout from {layout.source}"
    try:
        self_check(pid, layout)
    except PyRuntimeUnsupported as exc:
        return Check(name, UNSUPPORTED, f"{found}; self-check failed: {exc}")
    return Check(name, OK, f"{found}: the eBPF stack walker reads it")


def check_btf() -> Check:
    if Path("/sys/kernel/btf/vmlinux").exists():
        return Check("BTF", OK, "/sys/kernel/btf/vmlinux")
    return Check(
        "BTF", WARN, "no /sys/kernel/btf/vmlinux (bcc still works with headers)", NO_BTF_FIX
    )


def check_tracefs() -> Check:
    for directory in TRACEFS_DIRS:
        try:
            if (directory / "uprobe_events").exists():
                return Check("tracefs", OK, f"{directory}")
        except PermissionError:
            return Check(
                "tracefs", MISSING, f"{directory} is not readable by this user", "run as root"
            )
    return Check(
        "tracefs",
        MISSING,
        "not mounted: uprobes cannot be listed or cleaned",
        "mount -t tracefs nodev /sys/kernel/tracing",
    )


def check_uprobes() -> Check:
    try:
        with gzip.open("/proc/config.gz", "rt") as handle:
            config = handle.read()
    except OSError:
        return Check("uprobes", WARN, "no /proc/config.gz to confirm CONFIG_UPROBE_EVENTS")
    if "CONFIG_UPROBE_EVENTS=y" in config:
        kprobes = "on" if "CONFIG_KPROBES=y" in config else "off (profkit needs none)"
        return Check("uprobes", OK, f"CONFIG_UPROBE_EVENTS=y; kprobes {kprobes}")
    return Check(
        "uprobes", MISSING, "kernel built without CONFIG_UPROBE_EVENTS: no OpenMP region probes"
    )


# The library that decodes a runtime's code to place the region probes (capture/ebpf/placement/
# code.py; the ELF tables are profkit's own reader's), by module and by the name pip knows it.
CODE_READERS = {"capstone": "capstone"}
CODE_CHECK = "capstone"
DECODED_MACHINES = ("x86_64", "aarch64")


def check_code_readers(machine: str | None = None) -> Check:
    """capstone imports and decodes this machine's code: without it region ends fall back to a
    uretprobe, as they did without binutils."""
    machine = machine or platform.machine()
    found, missing = [], []
    for module, distribution in CODE_READERS.items():
        try:
            imported = importlib.import_module(module)
        except (ImportError, OSError) as exc:  # capstone's compiled library may fail to load
            missing.append(f"{distribution} ({exc})")
        else:
            try:
                version = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                version = getattr(imported, "__version__", "?")
            found.append(f"{distribution} {version}")
    fallback = "region ends fall back to a uretprobe, which makes py-spy --native's stops longer"
    if missing:
        return Check(
            CODE_CHECK,
            WARN,
            f"not importable: {', '.join(missing)}: {fallback}",
            fix="pip install capstone (a dependency of profkit)",
        )
    if machine not in DECODED_MACHINES:
        return Check(
            CODE_CHECK,
            UNSUPPORTED,
            f"only x86-64 and aarch64 code is decoded (this machine: {machine}): {fallback}",
        )
    return Check(
        CODE_CHECK,
        OK,
        f"{', '.join(found)}: region ends probed at the team barrier or at each return",
    )


def check_cgroups() -> Check:
    mounts = parse_mountinfo(MOUNTINFO.read_text())
    v1 = sorted(
        {
            c
            for m in mounts
            if m.version == "v1"
            for c in m.controllers
            if c in ("cpu", "cpuacct", "cpuset")
        }
    )
    v2 = [m for m in mounts if m.version == "v2"]
    v2_controllers: list[str] = []
    for mount in v2:
        with contextlib.suppress(OSError):
            v2_controllers += (mount.mount_point / "cgroup.controllers").read_text().split()
    if "cpu" in v1:
        return Check(
            "cgroups",
            OK,
            f"v1 controllers {','.join(v1)}"
            + (f"; cgroup2 tree at {v2[0].mount_point}" if v2 else ""),
        )
    if "cpu" in v2_controllers:
        return Check("cgroups", OK, f"v2 at {v2[0].mount_point}: {' '.join(v2_controllers)}")
    return Check("cgroups", WARN, "no cpu controller mounted: quota diagnosis unavailable")


def check_torch() -> Check:
    if importlib.util.find_spec("torch") is None:
        return Check(
            "torch",
            WARN,
            "not importable here (needed only for recipes and tests; the target has its own)",
            "pip install torch==2.13.0",
        )
    return Check("torch", OK, importlib.metadata.version("torch"))


def check_proc() -> Check:
    if Path("/proc/self/task").exists():
        return Check("/proc", OK, "per-thread stat readable", core=True)
    return Check("/proc", MISSING, "/proc is not mounted", "mount -t proc proc /proc", core=True)


CHECKS: tuple[Callable[[], Check | list[Check]], ...] = (
    check_distro,
    check_privileges,
    check_ptrace_scope,
    check_proc,
    check_pyspy,
    check_paranoid,
    check_perf,
    check_kernel_headers,
    check_bcc,
    check_btf,
    check_core,
    check_tracefs,
    check_uprobes,
    check_code_readers,
    check_cgroups,
    check_torch,
)


def run_checks(pid: int | None = None) -> list[Check]:
    """Every check; with a pid, the target's interpreter too."""
    results: list[Check] = []
    for check in CHECKS:
        outcome = check()
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    if pid is not None:
        results.append(check_python_target(pid))
    return settle_loaders(results)


def settle_loaders(checks: list[Check]) -> list[Check]:
    """Where the CO-RE object loads, a missing bcc, kernel headers or tracefs is not needed
    (only `--ebpf-loader bcc` uses them: the CO-RE loader attaches uprobes through links and
    perf events, not tracefs): said so, and the row offers no fix, since nothing needs one."""
    core = next((c for c in checks if c.name == CORE_CHECK), None)
    if core is None or not core.passed:
        return checks
    return [
        Check(
            c.name,
            NOT_NEEDED,
            f"CO-RE loads every program (only --ebpf-loader bcc uses this); {c.detail}",
            "",
            c.core,
        )
        if c.name in BCC_ONLY and c.status != OK
        else c
        for c in checks
    ]
