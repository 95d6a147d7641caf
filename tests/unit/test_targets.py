"""The bad-target paths of the CLI that need no process of the test's own."""

from __future__ import annotations

from profkit.errors import EXIT_NO_SUCH_PROCESS, EXIT_NOT_PYTHON, EXIT_USAGE

from ..support import run_profkit


def test_nonexistent_pid() -> None:
    result = run_profkit("quota", "--pid", "999999999")
    assert result.returncode == EXIT_NO_SUCH_PROCESS
    assert result.stderr.strip() == "profkit: error: no process with pid 999999999"


def test_pid_1_gets_one_line_and_a_documented_code() -> None:
    result = run_profkit("quota", "--pid", "1", "--window", "0")
    # pid 1 is either not Python or not inspectable here; never a traceback.
    assert result.returncode in (EXIT_NOT_PYTHON, 5, 0)
    assert "Traceback" not in result.stderr
    if result.returncode:
        assert len(result.stderr.strip().splitlines()) == 1


def test_garbage_arguments() -> None:
    for args in (
        ["quota", "--pid", "abc"],
        ["quota"],
        ["nosuchcommand"],
        ["quota", "--pid", "1", "--window", "-3"],
    ):
        result = run_profkit(*args)
        assert result.returncode == EXIT_USAGE, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr
