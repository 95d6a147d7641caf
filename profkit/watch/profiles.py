"""Each interval's merged profile as pprof: a rolling directory, and a Pyroscope /ingest push.

The directory is written as bundles are (bundle/safefile.py): root writes there, other users'
processes name the targets, so nothing is ever written, renamed or removed through a link, and
a target's name is made into a file name first. The push runs on its own thread with a bounded
queue, so that a slow or unreachable server never delays a window; a profile that cannot be
delivered is counted and dropped, never retried.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import os
import queue
import re
import secrets
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

from ..analysis.stacks import PYTHON, SYNTHETIC, Node, Stacks
from ..bundle.safefile import NEW_FILE
from ..errors import OutputError
from ..render.exports import pprof
from .labels import LABELS

APP_NAME = "profkit.cpu"
PUSH_TIMEOUT_S = 5.0
PY_FRAME = re.compile(r"\(.+:\d+\)$")
# The only names profkit writes in a target's directory, and so the only ones it prunes.
PROFILE_NAME = re.compile(r"(\d+)-(\d+)\.pb\.gz")
MAX_DIR_NAME = 80
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_REASON = 200


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


def target_dir_name(labels: tuple[str, ...]) -> str:
    """A target's directory name: never empty, '.', '..' or hidden, no '/', at most
    MAX_DIR_NAME characters. A name that had to be changed gets a digest of the labels, so
    that two targets do not share (and prune) one directory."""
    joined = "-".join(v for v in labels if v)
    name = re.sub(r"^\.", "_", re.sub(r"[^A-Za-z0-9_.-]+", "_", joined))
    if name != joined or len(name) > MAX_DIR_NAME:
        digest = hashlib.sha256(joined.encode(errors="replace")).hexdigest()[:12]
        name = f"{name[: MAX_DIR_NAME - len(digest) - 1]}-{digest}"
    return name or "target"


class ProfileDirectory:
    """DIR/<target>/<from>-<until>.pb.gz, the newest `keep` kept per target.

    DIR is opened once and held by descriptor, so that renaming or replacing its path later
    changes nothing; each target's directory is created 0700 and opened O_NOFOLLOW relative to
    it, and must be profkit's user's, not writable by others; each profile is created 0600
    with O_EXCL | O_NOFOLLOW under a fresh name and renamed into place (a reader never sees
    half a file). Pruning removes only plain files named as profkit names them, relative to
    the held directory: unlink removes a link, never what it points to.
    """

    def __init__(self, root: Path, keep: int) -> None:
        self.root = root
        self.keep = keep
        self._fd = open_root(root)

    def write(self, labels: tuple[str, ...], data: bytes, start: float, end: float) -> Path:
        name = target_dir_name(labels)
        fd = _open_subdirectory(self._fd, name, self.root / name)
        try:
            profile = f"{int(start * 1000)}-{int(end * 1000)}.pb.gz"
            _replace_at(fd, profile, data)
            self._prune(fd)
        finally:
            os.close(fd)
        return self.root / name / profile

    def _prune(self, fd: int) -> None:
        ours: list[tuple[tuple[int, int], str]] = []
        for entry in os.listdir(fd):
            found = PROFILE_NAME.fullmatch(entry)
            if not found:
                continue
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                    ours.append(((int(found.group(1)), int(found.group(2))), entry))
        ours.sort()
        for _, stale in ours[: -self.keep]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale, dir_fd=fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_root(root: Path) -> int:
    """Create DIR 0700 (or take one this user owns that no one else may write) and hold it.

    Refused, as bundles' --out is (exit 11, before anything is bound): a link, a directory
    another user owns or may write to (its owner could swap what profkit writes into)."""
    created = False
    try:
        root.mkdir(parents=True, mode=0o700)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise OutputError(f"cannot create --profiles {root}: {exc.strerror}") from exc
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        why = "it is a symbolic link" if os.path.islink(root) else exc.strerror
        raise OutputError(f"cannot use --profiles {root}: {why}") from exc
    try:
        _check_ours(fd, root)
        if created:
            os.fchmod(fd, 0o700)  # whatever the umask
    except OSError as exc:
        os.close(fd)
        raise OutputError(f"cannot use --profiles {root}: {exc.strerror or exc}") from exc
    return fd


def _check_ours(fd: int, path: Path) -> None:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise PermissionError(
            f"{path} is owned by uid {info.st_uid}, not by profkit's (uid {os.geteuid()}); "
            "its owner could plant links in it"
        )
    if info.st_mode & 0o022:
        raise PermissionError(
            f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
        )


def _open_subdirectory(parent: int, name: str, path: Path) -> int:
    created = False
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
        created = True
    except FileExistsError:
        pass
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)  # a link here: ELOOP, nothing written
    try:
        _check_ours(fd, path)
        if created:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _replace_at(directory: int, name: str, data: bytes) -> None:
    """name in the directory open at `directory`, written 0600 under a fresh name and renamed
    over it: a link planted at name is replaced, never followed."""
    for _ in range(16):
        temporary = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(temporary, NEW_FILE, 0o600, dir_fd=directory)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"no free temporary name for {name}")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(data)
        os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory)
        raise


@dataclass(frozen=True)
class PushItem:
    labels: tuple[str, ...]
    data: bytes
    start: float
    end: float


@dataclass(frozen=True)
class IngestRequest:
    url: str
    body: bytes
    headers: dict[str, str]


def ingest_request(url: str, item: PushItem) -> IngestRequest:
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
    return IngestRequest(
        f"{url}/ingest?{query}",
        body,
        {"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete answer within {self.seconds:g} s")
        return left


class _DeadlineReader(io.RawIOBase):
    """The answer's bytes, each read given only what is left of the request's time: a server
    that trickles a byte at a time cannot hold the push thread past the deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """What http.client uses of its socket (sendall, makefile, close), held to one deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock, self._deadline = sock, deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._deadline.left())  # sendall's timeout bounds the whole call
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        self._sock.close()


def post(request: IngestRequest, timeout: float = PUSH_TIMEOUT_S) -> None:
    """POST the request; returns once the answer's status line and headers say 2xx, raises
    otherwise. Connecting, the TLS handshake, sending and every read share one deadline (only
    resolving the host name is outside it)."""
    deadline = _Deadline(timeout)
    parts = urlsplit(request.url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.netloc, timeout=deadline.left())
    try:
        connection.connect()
        connection.sock = cast(socket.socket, _DeadlineSocket(connection.sock, deadline))
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request("POST", target, body=request.body, headers=request.headers)
        response = connection.getresponse()  # the body is not read: the status says it all
        if not 200 <= response.status < 300:
            raise http.client.HTTPException(f"HTTP {response.status} {response.reason}")
    finally:
        connection.close()


def describe(exc: BaseException) -> str:
    """One short printable line for any failure, whatever the server sent."""
    text = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


class Pusher:
    """Posts profiles in the background; counts what was delivered and what failed.

    Whatever a request meets (refused, a timeout, garbage or too many headers in the answer),
    it is counted as a failure and the thread goes on to the next profile."""

    def __init__(
        self, url: str, on_first_failure: Callable[[str], None], timeout: float = PUSH_TIMEOUT_S
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.sent = 0
        self.failed = 0
        self.last_error = ""
        self._queue: queue.Queue[PushItem | None] = queue.Queue(maxsize=64)
        self._warn = on_first_failure
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="profkit-push", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

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
                post(ingest_request(self.url, item), self.timeout)
                self.sent += 1
            except Exception as exc:  # nothing a server answers ends the thread
                self.failed += 1
                self.last_error = describe(exc)
                if not self._warned:
                    self._warned = True
                    with contextlib.suppress(Exception):
                        self._warn(
                            f"cannot push profiles to {self.url}: {self.last_error} (counted in "
                            "profkit_profile_push_failures_total; the agent keeps running)"
                        )

    def close(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=0.1)
        self._thread.join(timeout=timeout)


def now() -> float:
    return time.time()
