"""Bad input that needs no process of the test's own: one line and a documented exit code."""

from __future__ import annotations

import os

import pytest

from profkit.errors import EXIT_PERMISSION
from profkit.host import target as target_module
from recipes.launch import attach_args

from ..support import one_line, profkit_as_other_user


def test_pid_1(monkeypatch: pytest.MonkeyPatch) -> None:
    # pid 1 is root's: to any other user its executable link is unreadable, whatever it runs.
    if os.stat("/proc/1").st_uid == os.geteuid() != 0:
        pytest.skip("pid 1 runs as this (non-root) user here")
    result, left = profkit_as_other_user(*attach_args(1, duration=1))
    assert result.returncode == EXIT_PERMISSION, result.stderr
    assert one_line(result) == (
        "profkit: error: cannot inspect pid 1: permission denied "
        "(run as root or as the target's user)"
    )
    assert left == []
    # Refused as root, the advice is not to become what profkit already is.
    monkeypatch.setattr(target_module.os, "geteuid", lambda: 0)
    assert "run as root" not in target_module._denied()


def test_unreadable_environ_is_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(pid: int) -> dict[str, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(target_module.procfs, "read_environ", denied)
    inspected = target_module.inspect(os.getpid())
    assert not inspected.environ_readable and inspected.thread_env == {}
    assert target_module.pool_threads(inspected)[1] == "visible CPUs (affinity mask)"
