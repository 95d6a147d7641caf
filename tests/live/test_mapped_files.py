"""A library a target maps is read and probed as the very file mapped, never through its name:
a target run as nobody maps its own copy of libgomp, then puts at that name a link to a copy
only root may read (its directory 0700, the file 0600). The region probes must sit on the
target's copy (the kernel's links name no root-only path, and the regions the target runs are
counted), no capture's process may open the root-only file (fanotify names who does), and the bundle
must not tell the target whether that file is a valid library."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..support import NOBODY, run_profkit
from .bpf_links import UprobeLink, uprobe_multi_links

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
SYSTEM_LIBGOMP = Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1")

# Maps its own copy of libgomp, swaps the name for a link to the root-only file, then runs
# regions from dispatch_here (GOMP_parallel through ctypes: free(NULL) on two threads).
TARGET = """
import ctypes, os, sys, time
copy, elsewhere = sys.argv[1], sys.stdin.readline().strip()  # not in its command line
gomp = ctypes.CDLL(copy)
libc = ctypes.CDLL(None)
body = ctypes.cast(libc.free, ctypes.c_void_p)
gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
os.unlink(copy)
os.symlink(elsewhere, copy)
def dispatch_here():
    gomp.GOMP_parallel(body, None, 2, 0)
print("ready", flush=True)
while True:
    for _ in range(20):
        dispatch_here()
    time.sleep(0.01)
"""

# fanotify (linux/fanotify.h): unlike inotify it says which process opened the file, so that a
# root process elsewhere on the machine (a backup, an indexer) is told apart from profkit.
FAN_CLASS_NOTIF, FAN_CLOEXEC, FAN_NONBLOCK = 0x0, 0x1, 0x2
FAN_MARK_ADD, FAN_ACCESS, FAN_OPEN, FAN_OPEN_EXEC = 0x1, 0x1, 0x20, 0x1000
AT_FDCWD = -100
EVENT = struct.Struct("=IBBHQii")  # struct fanotify_event_metadata
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_mark.argtypes = [
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_uint64,
    ctypes.c_int,
    ctypes.c_char_p,
]


@dataclass(frozen=True)
class Opener:
    """A process that opened or read the watched file, read as its event arrived: its command
    line, and whether it is profkit or runs under it (resolved: False where the opener had
    exited by then, so neither could be read)."""

    pid: int
    argv: tuple[str, ...]
    profkit: bool
    resolved: bool

    def shown(self) -> str:
        if not self.resolved:
            return f"pid {self.pid} (exited before its event was read)"
        own = " ".join(self.argv)[:160]
        return f"pid {self.pid}: {own}" + (" (a capture's process)" if self.profkit else "")


def _is_profkit(argv: list[str]) -> bool:
    # `profkit ...`, `python .../bin/profkit ...` (a console script) or `python -m profkit`.
    return "profkit" in {Path(a).name for a in argv[:2]} or argv[1:3] == ["-m", "profkit"]


def _opener(pid: int) -> Opener:
    """Walks up from the opener until profkit or init: perf, py-spy and bpftool run under a
    capture's profkit process."""
    own: tuple[str, ...] = ()
    at = pid
    while at > 1:
        try:
            raw = Path(f"/proc/{at}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{at}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return Opener(pid, own, False, False)
        argv = [a.decode(errors="replace") for a in raw if a]
        own = own or tuple(argv)
        if _is_profkit(argv):
            return Opener(pid, own, True, True)
        at = parent
    return Opener(pid, own, False, True)


@contextlib.contextmanager
def watched(path: Path) -> Iterator[list[Opener]]:
    """Every process that opens or reads the file while the block runs (fanotify), each
    resolved to its command lines the moment its event is read."""
    fd = _libc.fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK, os.O_RDONLY)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    mask = FAN_OPEN | FAN_ACCESS | FAN_OPEN_EXEC
    assert _libc.fanotify_mark(fd, FAN_MARK_ADD, mask, AT_FDCWD, bytes(path)) == 0, os.strerror(
        ctypes.get_errno()
    )
    openers: list[Opener] = []
    stop = threading.Event()

    def drain() -> None:
        with contextlib.suppress(BlockingIOError):
            while data := os.read(fd, 4096):
                offset = 0
                while offset < len(data):
                    length, _, _, _, _, file_fd, pid = EVENT.unpack_from(data, offset)
                    offset += length
                    if file_fd >= 0:  # fanotify hands over an open descriptor of the file
                        os.close(file_fd)
                    openers.append(_opener(pid))

    def read() -> None:
        while not stop.is_set():
            select.select([fd], [], [], 0.05)
            drain()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield openers
    finally:
        stop.set()
        reader.join(timeout=5)
        drain()
        os.close(fd)


def assert_profkit_never_opened(openers: list[Opener]) -> None:
    """No capture's process opened the file; a process that exited before its event was read
    cannot be cleared, and counts against. Other processes of the machine are not profkit's."""
    against = {o.pid: o.shown() for o in openers if o.profkit or not o.resolved}
    if against:  # pytest.fail: only the message, not the objects' repr
        pytest.fail(
            "root opened or read the file only root may read: " + "; ".join(against.values())
        )


@pytest.fixture
def places() -> Iterator[dict[str, Path]]:
    top = Path(tempfile.mkdtemp(prefix="profkit-mapped-"))
    top.chmod(0o755)
    private = top / "private"
    private.mkdir(mode=0o700)
    mine = top / "target"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    try:
        yield {"private": private, "mine": mine}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def start_target(places: dict[str, Path], valid: bool) -> tuple[subprocess.Popen[str], Path]:
    hidden = places["private"] / "libgomp.so.1"
    if hidden.exists():
        hidden.unlink()
    if valid:
        shutil.copyfile(SYSTEM_LIBGOMP, hidden)
    else:
        hidden.write_bytes(b"not an ELF file, and only root may read it\n" * 100)
    hidden.chmod(0o600)
    copy = places["mine"] / "libgomp.so.1"
    for old in (copy,):
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    shutil.copyfile(SYSTEM_LIBGOMP, copy)
    os.chown(copy, NOBODY, NOBODY)
    target = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", TARGET, str(copy)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=places["mine"],
    )
    assert target.stdin is not None and target.stdout is not None
    target.stdin.write(f"{hidden}\n")
    target.stdin.flush()
    assert target.stdout.readline() == "ready\n"
    assert copy.is_symlink() and os.readlink(copy) == str(hidden)
    return target, copy


def capture(pid: int, loader: str, out: Path) -> list[UprobeLink]:
    """A capture of the target's regions, the probes on all the window; the kernel's
    multi-uprobe links of the target's pid, read while they were attached."""
    links: list[UprobeLink] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            mine = [link for link in uprobe_multi_links() if link.pid == pid]
            if mine:
                links[:] = mine
            stop.wait(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        done = run_profkit(
            "attach",
            "--pid",
            str(pid),
            "-d",
            "2",
            "--collectors",
            "ebpf,proc",
            "--ebpf-loader",
            loader,
            "--budget",
            "100",
            "--no-report",
            "-o",
            str(out),
            timeout=180,
        )
    finally:
        stop.set()
        poller.join(timeout=10)
    assert done.returncode == 0, done.stderr
    return links


def outputs(out: Path) -> dict[str, str]:
    """The bundle's files and the reports made from it, as text."""
    found = {f.name: f.read_text(errors="replace") for f in out.iterdir() if f.is_file()}
    for fmt in ("text", "json"):
        made = run_profkit("report", str(out), "--format", fmt)
        assert made.returncode == 0, made.stderr
        found[f"report.{fmt}"] = made.stdout
    return found


def summary(out: Path, copy: Path) -> dict[str, Any]:
    """What the bundle says of the runtime and its probes, without counts or times."""
    ebpf = json.loads((out / "ebpf.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "runtimes": ebpf["runtimes"],
        "attached": ebpf["attached"],
        "warnings": [w for w in ebpf["warnings"] if str(copy) in w or "region" in w],
        "target_runtimes": manifest["target"].get("runtimes"),
        "collectors": {k: v["status"] for k, v in manifest["collectors"].items()},
    }


@pytest.mark.parametrize("loader", ["core", "bcc"])
def test_a_library_swapped_for_a_link_is_probed_as_mapped(
    tmp_path: Path, places: dict[str, Path], loader: str
) -> None:
    summaries = []
    for valid in (True, False):
        target, copy = start_target(places, valid)
        out = tmp_path / f"{loader}-{valid}"
        try:
            with watched(places["private"] / "libgomp.so.1") as opened:
                links = capture(target.pid, loader, out)
        finally:
            target.kill()
            target.wait(timeout=20)
        assert_profkit_never_opened(opened)
        ebpf = json.loads((out / "ebpf.json").read_text())
        (runtime,) = ebpf["runtimes"]
        assert runtime["path"] == str(copy), runtime
        # The regions the target runs are counted: the probes sit on the code it runs.
        assert len(ebpf["regions"]["tid"]) > 50, ebpf["warnings"]
        stacks = ebpf["python"]["stacks"]
        sites = {stacks[i]["frames"][-1]["function"] for i in ebpf["regions"]["stack"] if i >= 0}
        assert sites == {"dispatch_here"}, sites
        if loader == "core":
            # The kernel's own account of what it probes: the target's copy, deleted.
            assert links, "no multi-uprobe link of the target's pid was seen"
            assert {link.path for link in links} == {f"{copy} (deleted)"}, links
        for name, text in outputs(out).items():
            assert str(places["private"]) not in text, name
        summaries.append(summary(out, copy))
    # Whether the file only root may read is a library or not changes nothing in the bundle.
    assert summaries[0] == summaries[1]


@pytest.mark.skipif(shutil.which("perf") is None, reason="needs perf")
def test_perf_names_the_frames_of_the_file_mapped_not_of_its_name(
    tmp_path: Path, places: dict[str, Path]
) -> None:
    """perf script names frames by the mappings' names; through its tree of the target's own
    mapped files (perfrecord.symbol_tree) it never reads the file a link at such a name points
    to, and a frame's file is the target's own name for it, ' (deleted)' and all."""
    target, copy = start_target(places, valid=True)
    out = tmp_path / "perf"
    try:
        with watched(places["private"] / "libgomp.so.1") as opened:
            done = run_profkit(
                *("attach", "--pid", str(target.pid), "-d", "2", "--no-report"),
                *("--collectors", "perf_record,proc", "-o", str(out)),
                timeout=180,
            )
    finally:
        target.kill()
        target.wait(timeout=20)
    assert done.returncode == 0, done.stderr
    assert_profkit_never_opened(opened)
    perf = json.loads((out / "perf.json").read_text())
    # The target's samples fall in the copy it mapped, under its own name for it. That copy is
    # deleted, and perf finds no file of that name in the tree: its frames read [unknown],
    # where before perf named them from whatever file the name pointed to by then.
    files = {dso for _, dso in perf["frames"]}
    assert f"{copy} (deleted)" in files, files
    for name, text in outputs(out).items():
        assert str(places["private"]) not in text, name


def test_the_watch_names_who_opened_the_file(places: dict[str, Path]) -> None:
    """The watch the tests above rely on sees a root process open the file, and names it."""
    hidden = places["private"] / "secret"
    hidden.write_bytes(b"only root may read this\n")
    hidden.chmod(0o600)
    with watched(hidden) as opened:
        script = "import sys, time; open(sys.argv[1]).read(); time.sleep(1)"
        reader = subprocess.Popen([sys.executable, "-c", script, str(hidden)])
        reader.wait(timeout=20)
    shown = [o.shown() for o in opened]
    assert opened, "the watch saw no open"
    assert all(o.pid == reader.pid and o.resolved and not o.profkit for o in opened), shown
    assert opened[0].argv[1:3] == ("-c", script), shown
    assert _is_profkit(["/venv/bin/python", "-m", "profkit", "attach"])
    assert _is_profkit(["/venv/bin/python", "/venv/bin/profkit", "attach"])
    assert not _is_profkit(["/venv/bin/python", "-m", "pytest", "tests/live/profkit"])
    with pytest.raises(pytest.fail.Exception):
        assert_profkit_never_opened([Opener(reader.pid, (), False, False)])
