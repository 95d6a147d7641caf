"""`watch` on bad input: one line and a documented exit code where it exits; where it must keep
running (no target yet, a target gone, a push server down), it keeps running and says so once."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from profkit.errors import EXIT_LISTEN, EXIT_USAGE

from ..support import run_profkit
from ..watch_support import agent


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profkit: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--match", "x", "--listen", "nonsense"], "is not HOST:PORT"),
        (["--match", "x", "--listen", "127.0.0.1:99999"], "port must be 1-65535"),
        (["--match", "x", "--listen", "example.com:9464"], "is not HOST:PORT"),
        ([], "give at least one target"),
        (["--match", "(unclosed"], "is not a regular expression"),
        (["--match", "x", "--interval", "0"], "--interval must be at least"),
        (["--match", "x", "--push", "ftp://host"], "is not an http(s) URL"),
        (["--pid", "0"], "--pid must be positive"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = run_profkit("watch", *args, timeout=30)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert message in one_error_line(result.stderr)


def test_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_profkit("watch", "--match", "x", "--listen", f"127.0.0.1:{port}", timeout=30)
    assert result.returncode == EXIT_LISTEN, result.stderr
    line = one_error_line(result.stderr)
    assert line == f"profkit: error: cannot listen on 127.0.0.1:{port}: the port is in use"


def test_address_not_on_this_host() -> None:
    result = run_profkit("watch", "--match", "x", "--listen", "192.0.2.1:9464", timeout=30)
    assert result.returncode == EXIT_LISTEN, result.stderr
    assert "the address is not on this host" in one_error_line(result.stderr)


def test_match_nothing_waits_and_says_so_once() -> None:
    with agent("--match", "no-such-command-[0-9]{12}", "--interval", "0.5") as a:
        a.wait_serving()
        time.sleep(3)  # six intervals
        assert a.process.poll() is None, a.output
        assert "profkit_targets 0.0" in a.metrics()
        code, took = a.terminate(sig=signal.SIGINT)  # Ctrl-C ends it as SIGTERM does
    assert code == 0 and took < 5
    waiting = [line for line in a.output.splitlines() if "no Python process matches" in line]
    assert waiting == [
        "profkit: no Python process matches --match 'no-such-command-[0-9]{12}'; waiting "
        "(checking every 0.5 s)"
    ], a.output
