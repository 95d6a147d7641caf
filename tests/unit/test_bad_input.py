"""Bad input that needs no process of the test's own: one line and a documented exit code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from profkit.errors import EXIT_NOT_PYTHON, EXIT_PERMISSION
from profkit.host import target as target_module
from recipes.launch import attach_args

from ..support import one_line, profkit_in


def test_pid_1(tmp_path: Path) -> None:
    result = profkit_in(tmp_path, *attach_args(1, duration=1))
    assert result.returncode in (EXIT_NOT_PYTHON, EXIT_PERMISSION), result.stderr
    line = one_line(result)
    if os.geteuid() == 0:
        assert "run as root" not in line, "advice to become what profkit already is"
    assert list(tmp_path.iterdir()) == []


def test_unreadable_environ_is_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(pid: int) -> dict[str, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(target_module.procfs, "read_environ", denied)
    inspected = target_module.inspect(os.getpid())
    assert not inspected.environ_readable and inspected.thread_env == {}
    assert target_module.pool_threads(inspected)[1] == "visible CPUs (affinity mask)"
