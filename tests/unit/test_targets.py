"""The bad-target paths of the CLI that need no process of the test's own."""

from __future__ import annotations

import os

import pytest

from profkit.errors import EXIT_NO_SUCH_PROCESS, EXIT_PERMISSION, EXIT_USAGE

from ..support import profkit_as_other_user, run_profkit


def test_nonexistent_pid() -> None:
    result = run_profkit("quota", "--pid", "999999999")
    assert result.returncode == EXIT_NO_SUCH_PROCESS
    assert result.stderr.strip() == "profkit: error: no process with pid 999999999"


def test_pid_1_gets_one_line_and_a_documented_code() -> None:
    # pid 1 is root's: to any other user its executable link is unreadable, whatever it runs.
    if os.stat("/proc/1").st_uid == os.geteuid() != 0:
        pytest.skip("pid 1 runs as this (non-root) user here")
    result, _ = profkit_as_other_user("quota", "--pid", "1", "--window", "0")
    assert result.returncode == EXIT_PERMISSION, result.stderr
    assert result.stderr == (
        "profkit: error: cannot inspect pid 1: permission denied "
        "(run as root or as the target's user)\n"
    )


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
