"""Bad input: one line, a documented exit code, nothing written outside the output directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profkit.errors import (
    EXIT_CAPABILITY,
    EXIT_NO_SUCH_PROCESS,
    EXIT_NOT_PYTHON,
    EXIT_OUTPUT,
    EXIT_PERMISSION,
    EXIT_USAGE,
)
from profkit.host import target as target_module

from .conftest import ROOT, needs_root

NOBODY = 65534
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


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


def profkit_in(cwd: Path, *args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "profkit", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    if user is not None:
        # The virtualenv's interpreter may live under root's home; the system one with a
        # readable copy of profkit and its packages on the path runs the same code as another
        # user.
        import tempfile

        site = Path(tempfile.mkdtemp(prefix="profkit-code-"))
        try:
            readable_copy(site)
        except BaseException:
            shutil.rmtree(site, ignore_errors=True)
            raise
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
        env["PYTHONPATH"] = str(site)
        try:
            return subprocess.run(
                command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env
            )
        finally:
            shutil.rmtree(site, ignore_errors=True)
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("profkit: error: ") and "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def python_target():  # type: ignore[no-untyped-def]
    process = subprocess.Popen([sys.executable, "-c", "import time, torch; time.sleep(60)"])
    time.sleep(1.5)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def sleeper():  # type: ignore[no-untyped-def]
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


CASES = {
    "nonexistent pid": (["attach", "--pid", "999999999"], EXIT_NO_SUCH_PROCESS),
    "negative pid": (["attach", "--pid", "-5"], EXIT_NO_SUCH_PROCESS),
    "duration zero": (["attach", "--pid", "{python}", "--duration", "0"], EXIT_USAGE),
    "duration negative": (["attach", "--pid", "{python}", "--duration", "-2"], EXIT_USAGE),
    "unknown collector": (
        ["attach", "--pid", "{python}", "--collectors", "ebpf,strace"],
        EXIT_USAGE,
    ),
    "non-python process": (["attach", "--pid", "{sleeper}", "--duration", "1"], EXIT_NOT_PYTHON),
    "garbage option": (["attach", "--pid", "{python}", "--frobnicate"], EXIT_USAGE),
    "rate out of range": (["attach", "--pid", "{python}", "--rate", "0"], EXIT_USAGE),
    "duration nan": (["attach", "--pid", "{python}", "--duration", "nan"], EXIT_USAGE),
    "duration inf": (["attach", "--pid", "{python}", "--duration", "inf"], EXIT_USAGE),
    "budget nan": (["attach", "--pid", "{python}", "--budget", "nan"], EXIT_USAGE),
    "cpu budget inf": (["attach", "--pid", "{python}", "--cpu-budget", "inf"], EXIT_USAGE),
    "max size nan": (["attach", "--pid", "{python}", "--max-size", "nan"], EXIT_USAGE),
    "perf rate zero": (["attach", "--pid", "{python}", "--perf-rate", "0"], EXIT_USAGE),
    "empty collectors": (["attach", "--pid", "{python}", "--collectors", ""], EXIT_USAGE),
    "blank collectors": (["attach", "--pid", "{python}", "--collectors", " , "], EXIT_USAGE),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_case(case: str, tmp_path: Path, python_target, sleeper) -> None:  # type: ignore[no-untyped-def]
    args, code = CASES[case]
    args = [
        a.replace("{python}", str(python_target.pid)).replace("{sleeper}", str(sleeper.pid))
        for a in args
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = profkit_in(tmp_path, *args)
    assert result.returncode == code, result.stderr
    one_line(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing written"
    assert python_target.poll() is None


def test_pid_1(tmp_path: Path) -> None:
    result = profkit_in(tmp_path, "attach", "--pid", "1", "--duration", "1")
    assert result.returncode in (EXIT_NOT_PYTHON, EXIT_PERMISSION), result.stderr
    line = one_line(result)
    if os.geteuid() == 0:
        assert "run as root" not in line, "advice to become what profkit already is"
    assert list(tmp_path.iterdir()) == []


@needs_root()
def test_python_without_torch_is_captured_with_a_note(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        time.sleep(0.5)
        result = profkit_in(
            tmp_path, "attach", "--pid", str(process.pid), "--duration", "1", "--out", "b"
        )
        assert result.returncode == 0, result.stderr
        assert "has no torch loaded" in result.stderr
        assert "cpu-fanout" not in result.stdout
    finally:
        process.kill()
        process.wait()


def test_unreadable_environ_is_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(pid: int) -> dict[str, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(target_module.procfs, "read_environ", denied)
    inspected = target_module.inspect(os.getpid())
    assert not inspected.environ_readable and inspected.thread_env == {}
    assert target_module.pool_threads(inspected)[1] == "visible CPUs (affinity mask)"


@needs_root()
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.skipif(
    not Path(SYSTEM_PYTHON).exists(), reason=f"needs {SYSTEM_PYTHON} to run profkit as another user"
)
def test_non_root_user(python_target) -> None:  # type: ignore[no-untyped-def]
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="profkit-nobody-"))
    tmp_path.chmod(0o777)
    doctor = profkit_in(tmp_path, "doctor", user=NOBODY)
    assert doctor.returncode == EXIT_CAPABILITY, doctor.stdout + doctor.stderr
    assert "CAP_SYS_PTRACE" in doctor.stdout
    attach = profkit_in(
        tmp_path, "attach", "--pid", str(python_target.pid), "--duration", "1", user=NOBODY
    )
    assert attach.returncode == EXIT_PERMISSION, attach.stderr
    assert "permission denied" in one_line(attach)
    assert list(tmp_path.iterdir()) == []
    tmp_path.rmdir()


@needs_root()
def test_output_on_a_full_tmpfs(tmp_path: Path, python_target) -> None:  # type: ignore[no-untyped-def]
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        (mount / "filler").write_bytes(b"\0" * 60 * 1024)
        result = profkit_in(
            tmp_path,
            "attach",
            "--pid",
            str(python_target.pid),
            "--duration",
            "1",
            "--out",
            str(mount / "bundle"),
            "--no-report",
        )
        assert result.returncode == EXIT_OUTPUT, result.stderr
        assert "No space left" in one_line(result) or "cannot write" in result.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]
        assert python_target.poll() is None
        assert "T" not in {target_module.procfs.read_stat(python_target.pid).state}
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_existing_nonempty_output_directory(tmp_path: Path, python_target) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = profkit_in(
        tmp_path, "attach", "--pid", str(python_target.pid), "--duration", "1", "--out", str(out)
    )
    assert result.returncode == EXIT_OUTPUT
    assert "exists and is not empty" in one_line(result)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
