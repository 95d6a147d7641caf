"""Bad input: one line, a documented exit code, nothing written outside the output directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
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
from recipes.launch import attach_args

from ..support import NOBODY, SYSTEM_PYTHON, one_line, profkit_in


@pytest.fixture
def python_target() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time, torch; time.sleep(60)"])
    time.sleep(1.5)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


CASES = {
    "nonexistent pid": (attach_args(999999999), EXIT_NO_SUCH_PROCESS),
    "negative pid": (attach_args(-5), EXIT_NO_SUCH_PROCESS),
    "duration zero": (attach_args("{python}", duration="0"), EXIT_USAGE),
    "duration negative": (attach_args("{python}", duration="-2"), EXIT_USAGE),
    "unknown collector": (attach_args("{python}", collectors="ebpf,strace"), EXIT_USAGE),
    "non-python process": (attach_args("{sleeper}", duration="1"), EXIT_NOT_PYTHON),
    "garbage option": (attach_args("{python}", extra=["--frobnicate"]), EXIT_USAGE),
    "rate out of range": (attach_args("{python}", rate="0"), EXIT_USAGE),
    "duration nan": (attach_args("{python}", duration="nan"), EXIT_USAGE),
    "duration inf": (attach_args("{python}", duration="inf"), EXIT_USAGE),
    "budget nan": (attach_args("{python}", budget="nan"), EXIT_USAGE),
    "cpu budget inf": (attach_args("{python}", cpu_budget="inf"), EXIT_USAGE),
    "max size nan": (attach_args("{python}", max_size="nan"), EXIT_USAGE),
    "perf rate zero": (attach_args("{python}", perf_rate="0"), EXIT_USAGE),
    "empty collectors": (attach_args("{python}", collectors=""), EXIT_USAGE),
    "blank collectors": (attach_args("{python}", collectors=" , "), EXIT_USAGE),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_case(
    case: str,
    tmp_path: Path,
    python_target: subprocess.Popen[bytes],
    sleeper: subprocess.Popen[bytes],
) -> None:
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


@pytest.mark.root
def test_python_without_torch_is_captured_with_a_note(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        time.sleep(0.5)
        result = profkit_in(tmp_path, *attach_args(process.pid, duration=1, out="b"))
        assert result.returncode == 0, result.stderr
        assert "has no torch loaded" in result.stderr
        assert "cpu-fanout" not in result.stdout
    finally:
        process.kill()
        process.wait()


@pytest.mark.root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.skipif(
    not Path(SYSTEM_PYTHON).exists(), reason=f"needs {SYSTEM_PYTHON} to run profkit as another user"
)
def test_non_root_user(python_target: subprocess.Popen[bytes]) -> None:
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="profkit-nobody-"))
    tmp_path.chmod(0o777)
    doctor = profkit_in(tmp_path, "doctor", user=NOBODY)
    assert doctor.returncode == EXIT_CAPABILITY, doctor.stdout + doctor.stderr
    assert "CAP_SYS_PTRACE" in doctor.stdout
    attach = profkit_in(tmp_path, *attach_args(python_target.pid, duration=1), user=NOBODY)
    assert attach.returncode == EXIT_PERMISSION, attach.stderr
    assert "permission denied" in one_line(attach)
    assert list(tmp_path.iterdir()) == []
    tmp_path.rmdir()


@pytest.mark.root
def test_output_on_a_full_tmpfs(tmp_path: Path, python_target: subprocess.Popen[bytes]) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        (mount / "filler").write_bytes(b"\0" * 60 * 1024)
        result = profkit_in(
            tmp_path,
            *attach_args(python_target.pid, duration=1, out=mount / "bundle", report=False),
        )
        assert result.returncode == EXIT_OUTPUT, result.stderr
        line = one_line(result)
        assert line.startswith("profkit: error: cannot write ") and "No space left" in line
        assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]
        assert python_target.poll() is None
        assert "T" not in {target_module.procfs.read_stat(python_target.pid).state}
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_existing_nonempty_output_directory(
    tmp_path: Path, python_target: subprocess.Popen[bytes]
) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = profkit_in(tmp_path, *attach_args(python_target.pid, duration=1, out=out))
    assert result.returncode == EXIT_OUTPUT
    assert "exists and is not empty" in one_line(result)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
