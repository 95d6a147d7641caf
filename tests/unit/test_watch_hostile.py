"""`watch` against what a watched process or a push server may hold: command lines that are not
names, labels that are not file names, links in the profile directory, servers that answer
garbage or trickle, targets that come and go; and intervals that are not numbers."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from profkit.errors import EXIT_USAGE, OutputError, UsageError
from profkit.watch.labels import MAX_NAME, SAFE_NAME, short_name
from profkit.watch.options import MAX_INTERVAL_S, check_expire, check_interval
from profkit.watch.profiles import (
    MAX_DIR_NAME,
    ProfileDirectory,
    Pusher,
    PushItem,
    target_dir_name,
)
from profkit.watch.series import EXPIRE_MIN_S, TargetSeries, expire, expiry_s

from ..support import one_line, run_profkit
from ..watch_support import free_port

SECRET = "--api-key=SECRET"


@pytest.mark.parametrize(
    ("cmdline", "comm", "name"),
    [
        # The argument of an option that takes one is never the script.
        (("python3", "-W", "..", "app.py"), "python3", "app"),
        (("python3", "-W", "ignore", "-X", "dev", "app.py"), "python3", "app"),
        (("python3", "-uW", "ignore", "app.py"), "python3", "app"),
        (("python3", "-Wignore", "-Xfrozen_modules=off", "app.py"), "python3", "app"),
        (("python3", "--check-hash-based-pycs", "never", "app.py"), "python3", "app"),
        (("python3", "-bB", "-m", "pkg.serve", "x"), "python3", "serve"),
        (("python3", "-mpkg.__main__"), "python3", "pkg"),
        (("python3", "-c", "import app; app.main()", "app.py"), "python3", "python3"),
        (("python3", "-ic", "code"), "python3", "python3"),
        (("python3", "--", "app.py"), "python3", "app"),
        (("python3", "-", "app.py"), "python3", "python3"),
        (("python3", "-W", ".."), "python3", "python3"),
        (("python3", ".."), "python3", "python3"),
        (("python3", "my script.py"), "python3", "python3"),
        # A rewritten argv[0] (exec -a, setproctitle) is never published: comm stands in.
        ((f"worker {SECRET}", "app.py"), "python3.11", "app"),
        ((f"worker {SECRET}",), "worker", "worker"),
        ((f"{SECRET} python3", "-W", "..", "app.py"), "python3", "app"),
        ((SECRET,), "bad comm", "unknown"),
        (("",), "python3", "python3"),
        (("/usr/bin/" + "x" * 300,), "x", "x" * MAX_NAME),
    ],
)
def test_short_name_is_a_name_never_argument_text(
    cmdline: tuple[str, ...], comm: str, name: str
) -> None:
    got = short_name(cmdline, comm)
    assert got == name
    assert SAFE_NAME.fullmatch(got) and len(got) <= MAX_NAME
    assert "SECRET" not in got and got not in (".", "..")


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 1e12, -1.0, 0.0, 0.49, 3601.0])
def test_interval_out_of_range_is_refused(seconds: float) -> None:
    with pytest.raises(UsageError, match="--interval must be at least"):
        check_interval(seconds)


@pytest.mark.parametrize("seconds", [0.5, 15.0, MAX_INTERVAL_S])
def test_interval_in_range(seconds: float) -> None:
    assert check_interval(seconds) == seconds


@pytest.mark.parametrize("command", ["watch", "top"])
@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "-inf"])
def test_interval_refused_before_the_port_is_bound(command: str, value: str) -> None:
    port = free_port()
    listen = ["--listen", f"127.0.0.1:{port}"] if command == "watch" else []
    match = ["--match", "no-such-command-[0-9]{12}", "--no-probes"]
    result = run_profkit(command, *match, *listen, "--interval", value, timeout=30)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "--interval must be at least 0.5 s and at most 3600 s" in one_line(result)
    assert "serving metrics" not in result.stderr


@pytest.mark.parametrize(
    "labels",
    [
        ("..", "", "", ""),
        (".", "", "", ""),
        ("", "", "", ""),
        ("a/../../b", "", "", ""),
        ("/etc", "", "", ""),
        (".hidden", "", "", ""),
        ("x" * 1000, "ns", "pod", ""),
        ("a\0b\nc", "", "", ""),
    ],
)
def test_target_dir_name_is_one_plain_bounded_name(labels: tuple[str, ...]) -> None:
    name = target_dir_name(labels)
    assert name not in ("", ".", "..") and not name.startswith(".")
    assert "/" not in name and "\0" not in name and len(name) <= MAX_DIR_NAME
    assert SAFE_NAME.fullmatch(name)


def test_target_dir_names_stay_apart() -> None:
    assert target_dir_name(("fanout", "", "", "")) == "fanout"
    assert target_dir_name(("srv", "ml", "srv-0", "abc")) == "srv-ml-srv-0-abc"
    names = {target_dir_name((t, "", "", "")) for t in ("..", "_.", "a b", "a_b", "a/b")}
    assert len(names) == 5


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def tree(directory: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every name under directory, links not followed: kind, mode, content or link target."""
    out: dict[str, tuple[str, int, bytes]] = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            out[str(path.relative_to(directory))] = ("link", 0, os.readlink(path).encode())
        elif stat.S_ISDIR(info.st_mode):
            out[str(path.relative_to(directory))] = ("dir", stat.S_IMODE(info.st_mode), b"")
        else:
            entry = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
            out[str(path.relative_to(directory))] = entry
    return out


def test_profiles_mode_and_labels_that_are_not_names(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "1-2.pb.gz").write_bytes(b"victim in the parent")
    before = tree(parent)
    with umask(0):
        profiles = ProfileDirectory(parent / "profiles", keep=2)
        for i in range(4):
            profiles.write(("..", "", "", ""), b"profile %d" % i, 100 + i, 101 + i)
            profiles.write(("", "", "", ""), b"profile %d" % i, 100 + i, 101 + i)
    profiles.close()
    after = tree(parent)
    assert {k: v for k, v in after.items() if not k.startswith("profiles")} == before
    assert after["profiles"][:2] == ("dir", 0o700)
    written = {k: v for k, v in after.items() if k.count("/") == 2}
    assert len(written) == 4, after  # two targets, --keep 2 each
    for name, (kind, mode, _) in after.items():
        if name.startswith("profiles/"):
            assert (kind, mode) == (("dir", 0o700) if name.count("/") == 1 else ("file", 0o600))
    assert not [k for k in after if k.endswith(".tmp")]


def test_a_link_planted_for_a_target_is_never_followed(tmp_path: Path) -> None:
    victims = tmp_path / "victims"
    victims.mkdir(mode=0o700)
    for name in ("1-2.pb.gz", "3-4.pb.gz", "notes.txt"):
        (victims / name).write_bytes(b"victim " + name.encode())
    before = tree(victims)
    profiles = ProfileDirectory(tmp_path / "profiles", keep=1)
    (tmp_path / "profiles" / "srv").symlink_to(victims)
    with pytest.raises(OSError):
        profiles.write(("srv", "", "", ""), b"profile", 10, 11)
    # A link named as a profile, inside the target's own directory: replaced, never followed,
    # and never pruned through.
    profiles.write(("web", "", "", ""), b"first", 10, 11)
    (tmp_path / "profiles" / "web" / "5-6.pb.gz").symlink_to(victims / "1-2.pb.gz")
    (tmp_path / "profiles" / "web" / "20000-21000.pb.gz").symlink_to(victims / "3-4.pb.gz")
    for i in range(3):
        profiles.write(("web", "", "", ""), b"next", 20 + i, 21 + i)
    profiles.close()
    assert tree(victims) == before
    web = tree(tmp_path / "profiles" / "web")
    assert web["22000-23000.pb.gz"] == ("file", 0o600, b"next")
    assert web["5-6.pb.gz"][0] == "link"  # not a file profkit wrote: left alone
    assert [k for k, v in web.items() if v[0] == "file"] == ["22000-23000.pb.gz"]


def test_profiles_directory_held_by_descriptor(tmp_path: Path) -> None:
    profiles = ProfileDirectory(tmp_path / "profiles", keep=5)
    (tmp_path / "profiles").rename(tmp_path / "moved")
    (tmp_path / "profiles").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    profiles.write(("t", "", "", ""), b"p", 1, 2)
    profiles.close()
    assert (tmp_path / "moved" / "t" / "1000-2000.pb.gz").read_bytes() == b"p"
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_profiles_dir_refused_when_others_could_plant(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OutputError, match="symbolic link"):
        ProfileDirectory(tmp_path / "link", keep=1)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(OutputError, match="can be written by other users"):
        ProfileDirectory(shared, keep=1)
    assert list(shared.iterdir()) == [] and list((tmp_path / "real").iterdir()) == []


def test_series_of_gone_targets_expire() -> None:
    a, b = ("a", "", "", ""), ("b", "", "", "")
    series: dict[tuple[str, ...], TargetSeries] = {a: TargetSeries(a), b: TargetSeries(b)}
    assert expiry_s(0.5) == EXPIRE_MIN_S and expiry_s(60) == 240
    after = expiry_s(0.5)
    assert expire(series, {a}, 1000.0, after) == []
    assert expire(series, {a}, 1000.0 + after - 1, after) == []
    # b comes back before it expires: it keeps its series, and its clock starts again.
    assert expire(series, {a, b}, 1000.0 + after - 0.5, after) == []
    assert expire(series, {a}, 1100.0, after) == []
    assert expire(series, {a}, 1100.0 + after, after) == [b]
    assert set(series) == {a}


def test_expire_is_checked_against_the_interval() -> None:
    assert check_expire(None, 15) is None and check_expire(15, 15) == 15
    for bad in (14.9, float("nan"), float("inf"), 86401):
        with pytest.raises(UsageError, match="--expire must be at least the interval"):
            check_expire(bad, 15)
    result = run_profkit("watch", "--pid", "1", "--interval", "2", "--expire", "1")
    assert result.returncode == EXIT_USAGE and "--expire" in one_line(result)


# -- push ------------------------------------------------------------------------------------

Answer = Callable[[socket.socket], None]


def garbage(conn: socket.socket) -> None:
    conn.sendall(b"\x00\xffthis is not HTTP\r\n\r\n")


def many_headers(conn: socket.socket) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
    conn.sendall(b"HTTP/1.1 200 OK\r\n" + headers + b"Content-Length: 0\r\n\r\n")


def ok(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def trickle(every: float, bound: float) -> Answer:
    """One byte every `every` seconds until the client closes, or `bound` seconds."""

    def answer(conn: socket.socket) -> None:
        end = time.monotonic() + bound
        for byte in b"HTTP/1.1 200 OK\r\n" * 8:
            conn.settimeout(max(0.01, min(every, end - time.monotonic())))
            try:
                if conn.recv(1) == b"":
                    return  # the client gave up
            except TimeoutError:
                pass
            except OSError:
                return
            if time.monotonic() >= end:
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return

    return answer


class ScriptedServer:
    """A loopback server answering its n-th request with answers[n] (the last one from then
    on), after reading the request; records how long each connection stayed open."""

    def __init__(self, answers: list[Answer], timeout: float = 60) -> None:
        self.answers = answers
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.durations: list[float] = []
        self.paths: list[str] = []
        self._stop = threading.Event()
        self._deadline = time.monotonic() + timeout
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            start = time.monotonic()
            with conn:
                conn.settimeout(5)
                try:
                    self.paths.append(self._read_request(conn))
                    answer = self.answers[min(len(self.durations), len(self.answers) - 1)]
                    answer(conn)
                except OSError:
                    pass
            self.durations.append(time.monotonic() - start)

    @staticmethod
    def _read_request(conn: socket.socket) -> str:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head.split(b"\r\n")[0].decode(errors="replace")


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_push_thread_survives_any_answer_and_each_request_is_bounded() -> None:
    warnings: list[str] = []
    timeout = 1.0
    answers = [garbage, many_headers, trickle(every=0.4, bound=20), ok]
    with ScriptedServer(answers) as server:
        pusher = Pusher(server.url, warnings.append, timeout=timeout)
        try:
            item = PushItem(("t", "", "", ""), b"profile", 100.0, 101.0)
            for _ in range(3):
                pusher.submit(item)
            assert wait_for(lambda: pusher.failed == 3, 10), (pusher.failed, pusher.last_error)
            assert pusher.sent == 0 and pusher.alive
            for _ in range(2):
                pusher.submit(item)
            assert wait_for(lambda: pusher.sent == 2, 10), (pusher.sent, pusher.last_error)
            assert pusher.failed == 3 and pusher.alive
        finally:
            pusher.close()
    # The trickling server was cut at the deadline, not when it stopped trickling.
    assert server.durations[2] < timeout + 1.0, server.durations
    assert all(p.startswith("POST /ingest?name=profkit.cpu") for p in server.paths), server.paths
    assert len(warnings) == 1 and warnings[0].startswith(f"cannot push profiles to {server.url}")
    assert "\n" not in warnings[0] and len(warnings[0]) < 400


def test_push_to_nothing_and_a_refusing_server_counts_failures() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    warnings: list[str] = []
    pusher = Pusher(dead, warnings.append, timeout=1.0)
    try:
        pusher.submit(PushItem(("t", "", "", ""), b"p", 1.0, 2.0))
        assert wait_for(lambda: pusher.failed == 1, 5)
    finally:
        pusher.close()
    assert "Connection refused" in warnings[0]

    def refuse(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")

    with ScriptedServer([refuse, ok]) as server:
        pusher = Pusher(server.url, warnings.append, timeout=1.0)
        try:
            pusher.submit(PushItem(("t", "", "", ""), b"p", 1.0, 2.0))
            pusher.submit(PushItem(("t", "", "", ""), b"p", 1.0, 2.0))
            assert wait_for(lambda: (pusher.failed, pusher.sent) == (1, 1), 5)
            assert "HTTP 500" in pusher.last_error
        finally:
            pusher.close()
