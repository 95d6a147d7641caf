"""What tests/unit and tests/live share: where things are, and profkit's command line run as a
child, as this user or as another one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
DATA = Path(__file__).resolve().parent / "data"

NOBODY = 65534
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"

# bcc names each tracefs uprobe event after the process that made it (..._bcc_<pid>), and so does
# libbpf where it has to fall back to tracefs (libbpf_<pid>_...); its usual uprobes are perf
# events, gone with their file descriptors.
_EVENT_OWNER = re.compile(r"(?:_bcc_|libbpf_)(\d+)")


def uprobe_events() -> list[str]:
    """The machine's tracefs uprobe events, one line each."""
    for base in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        path = Path(base) / "uprobe_events"
        if path.exists():
            return path.read_text().splitlines()
    return []


def stale_uprobe_events() -> list[str]:
    """The uprobe events whose maker has exited: what a tracer left behind. Events of processes
    still running belong to other captures (tests run in lanes), not to the one checked."""
    stale = []
    for line in uprobe_events():
        owner = _EVENT_OWNER.search(line)
        if owner is None or not Path(f"/proc/{owner.group(1)}").exists():
            stale.append(line)
    return stale


# A kernel without BTF, as far as profkit can tell: /sys/kernel/btf hidden under an empty tmpfs
# in a mount namespace of the command's own (the CO-RE object cannot load there).
NO_BTF = ("/sys/kernel/btf",)


def hiding(hide: tuple[str, ...], argv: list[str]) -> list[str]:
    """argv run in a private mount namespace where each directory of `hide` is an empty tmpfs;
    the rest of the machine sees them as they are."""
    if not hide:
        return argv
    mounts = "".join(f'mount -t tmpfs -o size=64k none "{d}" || exit 97; ' for d in hide)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        mounts + 'exec "$@"',
        "sh",
        *argv,
    ]


def run_profkit(
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    hide: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hiding(hide, [sys.executable, "-m", "profkit", *args]),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def profkit(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """run_profkit without writing bytecode next to the code."""
    return run_profkit(*args, timeout=timeout, env={"PYTHONDONTWRITEBYTECODE": "1", **(env or {})})


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("profkit: error: ") and "Traceback" not in result.stderr
    return lines[0]


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a command refused after it had begun: notes it printed on the way
    (profkit: note: ...) may come before it, nothing else."""
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("profkit: error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(line.startswith("profkit: note: ") for line in lines if line != errors[0])
    return errors[0]


LIST_IMPORTS = """
import pkgutil, importlib, sys
import profkit
for info in pkgutil.walk_packages(profkit.__path__, "profkit."):
    if info.name != "profkit.__main__":  # that one runs the command line
        importlib.import_module(info.name)
files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
print("\\n".join(sorted(f for f in files if f)))
"""


def readable_copy(into: Path) -> Path:
    """profkit and every package it imports, copied where another user can read them: the
    checkout and its virtualenv may sit under a directory only root may enter (/root, a 0700
    temporary directory), which the copy does not change."""
    listed = subprocess.run(
        [sys.executable, "-c", LIST_IMPORTS], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    roots = {ROOT / "profkit"}
    for name in listed:
        path = Path(name)
        if path.is_relative_to(site):
            top = site / path.relative_to(site).parts[0]
            roots.add(top)
            roots.add(site / f"{top.name}.libs")  # a wheel's bundled shared libraries
    for root in roots:
        if root.is_dir():
            shutil.copytree(root, into / root.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif root.suffix in (".py", ".so"):
            shutil.copy2(root, into / root.name)
    for dist in site.glob("*.dist-info"):  # importlib.metadata reads versions from these
        shutil.copytree(dist, into / dist.name)
    for path in [into, *into.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return into


_READABLE_SITE: Path | None = None


def readable_site() -> Path:
    """One readable copy of profkit and its packages per test process, compiled once: copying
    and compiling it for every command run as another user cost seconds each. Removed when the
    process exits."""
    global _READABLE_SITE
    if _READABLE_SITE is None:
        import atexit
        import tempfile

        site = Path(tempfile.mkdtemp(prefix="profkit-code-"))
        atexit.register(shutil.rmtree, site, ignore_errors=True)
        try:
            readable_copy(site)
            # Compiled by the interpreter that runs it, so that its bytecode is the one read.
            subprocess.run(
                [SYSTEM_PYTHON, "-m", "compileall", "-q", "-j", "0", str(site)],
                check=True,
                capture_output=True,
            )
            for path in [site, *site.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
        except BaseException:
            shutil.rmtree(site, ignore_errors=True)
            raise
        _READABLE_SITE = site
    return _READABLE_SITE


def profkit_in(cwd: Path, *args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "profkit", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    if user is not None:
        # The virtualenv's interpreter may live under root's home; the system one with a
        # readable copy of profkit and its packages on the path runs the same code as another
        # user.
        command = [
            "setpriv",
            f"--reuid={user}",
            f"--regid={user}",
            "--clear-groups",
            "--inh-caps=-all",
            SYSTEM_PYTHON,
            "-m",
            "profkit",
            *args,
        ]
        env["PYTHONPATH"] = str(readable_site())
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def profkit_as_other_user(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """profkit run by a user other than root, in a fresh directory that user may write to: the
    tests' own user where that is not root, else nobody. Gives the result and what was left in
    that directory."""
    import tempfile

    user = None
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None or not Path(SYSTEM_PYTHON).exists():
            pytest.skip(f"needs setpriv and {SYSTEM_PYTHON} to run profkit as nobody")
        user = NOBODY
    cwd = Path(tempfile.mkdtemp(prefix="profkit-other-user-"))
    try:
        cwd.chmod(0o777)
        result = profkit_in(cwd, *args, user=user)
        return result, sorted(p.name for p in cwd.iterdir())
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
