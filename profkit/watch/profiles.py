"""Each interval's merged profile as pprof: a rolling directory, and a Pyroscope /ingest push.

The push runs on its own thread with a bounded queue, so that a slow or unreachable server never
delays a window; a profile that cannot be delivered is counted and dropped, never retried.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from ..analysis.stacks import PYTHON, SYNTHETIC, Node, Stacks
from ..render.exports import pprof
from .labels import LABELS

APP_NAME = "profkit.cpu"
PUSH_TIMEOUT_S = 5.0
PY_FRAME = re.compile(r"\(.+:\d+\)$")


def pprof_bytes(weights: dict[tuple[str, ...], float], seconds: float) -> bytes:
    nodes = {
        tuple(Node(name, PYTHON if PY_FRAME.search(name) else SYNTHETIC) for name in stack): cpu
        for stack, cpu in weights.items()
    }
    return pprof(Stacks("merged", nodes, sum(nodes.values()), seconds, {}))


def series_name(labels: tuple[str, ...]) -> str:
    """Pyroscope's application name with its labels: profkit.cpu{target=...,pod=...}."""
    pairs = [f"{k}={_label(v)}" for k, v in zip(LABELS, labels, strict=True) if v]
    return f"{APP_NAME}{{{','.join(pairs)}}}"


def _label(value: str) -> str:
    # Pyroscope label values may not hold the separators of its name syntax.
    return re.sub(r"[{},=\s]", "_", value)


def _slug(labels: tuple[str, ...]) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(v for v in labels if v)) or "target"


class ProfileDirectory:
    """DIR/<target>/<from>-<until>.pb.gz, the newest `keep` kept per target."""

    def __init__(self, root: Path, keep: int) -> None:
        self.root = root
        self.keep = keep

    def write(self, labels: tuple[str, ...], data: bytes, start: float, end: float) -> Path:
        directory = self.root / _slug(labels)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{int(start * 1000)}-{int(end * 1000)}.pb.gz"
        partial = path.with_suffix(".tmp")
        partial.write_bytes(data)
        partial.replace(path)  # a reader never sees half a profile
        old = sorted(directory.glob("*.pb.gz"))[: -self.keep]
        for stale in old:
            with contextlib.suppress(OSError):
                stale.unlink()
        return path


@dataclass(frozen=True)
class PushItem:
    labels: tuple[str, ...]
    data: bytes
    start: float
    end: float


def ingest_request(url: str, item: PushItem) -> urllib.request.Request:
    query = urlencode(
        {
            "name": series_name(item.labels),
            "from": int(item.start),
            "until": max(int(item.end), int(item.start) + 1),
            "format": "pprof",
            "spyName": "profkit",
        }
    )
    boundary = uuid.uuid4().hex
    body = (
        (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="profile"; filename="profile.pprof"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + item.data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return urllib.request.Request(
        f"{url}/ingest?{query}",
        data=body,
        method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )


class Pusher:
    """Posts profiles in the background; counts what was delivered and what failed."""

    def __init__(self, url: str, on_first_failure: Callable[[str], None]) -> None:
        self.url = url
        self.sent = 0
        self.failed = 0
        self.last_error = ""
        self._queue: queue.Queue[PushItem | None] = queue.Queue(maxsize=64)
        self._warn = on_first_failure
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="profkit-push", daemon=True)
        self._thread.start()

    def submit(self, item: PushItem) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.failed += 1  # the server is too slow to keep up: this window is dropped

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                with urllib.request.urlopen(ingest_request(self.url, item), timeout=PUSH_TIMEOUT_S):
                    pass
                self.sent += 1
            except (OSError, urllib.error.URLError, ValueError) as exc:
                self.failed += 1
                reason = getattr(exc, "reason", exc)
                self.last_error = str(reason)
                if not self._warned:
                    self._warned = True
                    self._warn(
                        f"cannot push profiles to {self.url}: {reason} (counted in "
                        "profkit_profile_push_failures_total; the agent keeps running)"
                    )

    def close(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=0.1)
        self._thread.join(timeout=timeout)


def now() -> float:
    return time.time()
