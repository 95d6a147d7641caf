"""Helpers of the `watch` tests: an agent process, a real Prometheus, PromQL over its HTTP API."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def need_prometheus() -> str:
    if PROMETHEUS is None:
        pytest.skip("no prometheus: apt-get install prometheus (make test installs it)")
    return PROMETHEUS


def need_promtool() -> str:
    if PROMTOOL is None:
        pytest.skip("no promtool: apt-get install prometheus (make test installs it)")
    return PROMTOOL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class AgentProcess:
    """`profkit watch` as a child process, its stderr collected all the time."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.args = ["--listen", f"127.0.0.1:{self.port}", *args]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "profkit", "watch", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        self.output = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output += line

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def wait_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"watch exited {self.process.returncode}: {self.output}")
            with contextlib.suppress(OSError):
                http_get(self.url, timeout=2)
                return
            time.sleep(0.2)
        raise AssertionError(f"watch never served metrics: {self.output}")

    def metrics(self) -> str:
        return http_get(self.url)

    def wait_for(self, ready: Callable[[str], bool], timeout: float = 300.0) -> str:
        """The metrics once ready(metrics) holds. The probe's load (a bcc compile, the return
        sites' decoding) takes whatever CPU a busy machine leaves it: the timeout guards against
        a hang, it measures nothing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"watch exited {self.process.returncode}: {self.output}")
            metrics = self.metrics()
            if ready(metrics):
                return metrics
            time.sleep(0.5)
        raise AssertionError(f"watch's metrics never got ready in {timeout} s: {self.output}")

    def terminate(self, timeout: float = 5.0, sig: int = signal.SIGTERM) -> tuple[int, float]:
        """SIGTERM (or sig); (exit status, seconds it took). Killed, and the test fails, past
        timeout."""
        if self.process.poll() is not None:
            return self.process.returncode, 0.0
        start = time.monotonic()
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"watch did not stop within {timeout} s: {self.output}") from None
        self._reader.join(timeout=5)
        return code, time.monotonic() - start


@contextlib.contextmanager
def agent(*args: str) -> Iterator[AgentProcess]:
    proc = AgentProcess(*args)
    try:
        yield proc
    finally:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait()


@contextlib.contextmanager
def prometheus(targets: list[str], scrape_s: int = 5) -> Iterator[str]:
    """A real Prometheus on loopback with its own config and data directory; its base URL."""
    binary = need_prometheus()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="profkit-prom-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": f"{scrape_s}s", "evaluation_interval": "5s"},
                    "scrape_configs": [
                        {
                            "job_name": "profkit",
                            "scrape_interval": f"{scrape_s}s",
                            "static_configs": [{"targets": targets}],
                        }
                    ],
                }
            )
        )
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    assert process.stderr is not None
                    raise AssertionError(f"prometheus exited: {process.stderr.read()}")
                with contextlib.suppress(OSError):
                    http_get(f"{base}/-/ready", timeout=2)
                    break
                if time.monotonic() > deadline:
                    raise AssertionError("prometheus never became ready")
                time.sleep(0.3)
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def promql(base: str, query: str, at: float | None = None) -> list[dict]:
    params = {"query": query}
    if at is not None:
        params["time"] = f"{at:.3f}"
    body = json.loads(http_get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


def samples(base: str, selector: str, seconds: int, at: float) -> list[tuple[float, float]]:
    """The raw samples of one series over the last `seconds` before `at`."""
    result = promql(base, f"{selector}[{seconds}s]", at)
    assert len(result) == 1, f"{selector}: expected one series, got {result}"
    return [(float(t), float(v)) for t, v in result[0]["values"]]


def interpolate(readings: list[tuple[float, float]], t: float) -> float:
    """A value at time t from (time, value) readings taken densely around it."""
    before = [r for r in readings if r[0] <= t]
    after = [r for r in readings if r[0] >= t]
    assert before and after, f"no readings around {t}"
    (t0, v0), (t1, v1) = before[-1], after[0]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


class Readings:
    """Reads a function of the clock every `step` s on a thread: the test's own ground truth."""

    def __init__(self, read: Callable[[], object], step: float = 0.1) -> None:
        self.read = read
        self.step = step
        self.values: list[tuple[float, object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                value = self.read()
                self.values.append((time.time(), value))
            self._stop.wait(self.step)

    def __enter__(self) -> Readings:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def series(self, key: Callable[[Any], float]) -> list[tuple[float, float]]:
        return [(t, float(key(v))) for t, v in self.values]


def thread_cpu(pid: int) -> dict[int, float]:
    """Per-thread CPU seconds of a process, straight from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out
