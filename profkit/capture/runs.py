"""A record of every capture in progress, so that a profkit killed outright can be cleaned up.

Each capture writes /run/profkit/<profkit pid>.json (mode 0600) with its target and the child
tools it started, and removes it when it ends. The next profkit run finds records whose owner is
gone and undoes what could be left: child tools still running are killed (after checking their
start time, so that a reused pid is never touched), a target left stopped is resumed, the
bundle is marked aborted and its perf.data removed. eBPF probes need nothing: profkit attaches
them through perf events, which the kernel removes with the dead process's file descriptors.

One capture per target: each holds an flock on /run/profkit/target-PID-START.lock, which the
kernel drops when its holder dies however it dies, so a lock left by a killed profkit is simply
taken. A capture run with --force beside another leaves the other a notice
(<owner>.overlap-<pid>), so that both manifests say they overlapped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..bundle.parts import MANIFEST, PERF_DATA
from ..bundle.safefile import held_directory, replace_file, write_new
from ..errors import OutputError, TargetBusy
from ..host import procfs

RUN_DIR = Path(os.environ.get("PROFKIT_RUN_DIR", "/run/profkit"))


@dataclass(frozen=True)
class Child:
    pid: int
    start: int | None  # its start time: a later run touches the pid only if it still matches


@dataclass(frozen=True)
class Cleanup:
    owner: int
    actions: tuple[str, ...]


def _start_ticks(pid: int) -> int | None:
    try:
        return procfs.read_stat(pid).start_ticks
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None


class RunRecord:
    """The live record of this capture; a context manager that removes it on exit."""

    def __init__(
        self, target_pid: int, target_start: int, bundle: Path, bundle_fd: int | None = None
    ) -> None:
        self.path = RUN_DIR / f"{os.getpid()}.json"
        identity = os.fstat(bundle_fd) if bundle_fd is not None else None
        self.data: dict[str, object] = {
            "owner": os.getpid(),
            "owner_start": _start_ticks(os.getpid()),
            "target": target_pid,
            "target_start": target_start,
            "bundle": str(bundle),
            # A later run marks the bundle aborted only if the name still leads to this one.
            "bundle_inode": [identity.st_dev, identity.st_ino] if identity else None,
        }
        self.children: list[Child] = []
        # Set when the bundle could not be marked aborted: the record stays for the next run.
        self.keep = False

    def add_child(self, pid: int) -> None:
        self.children.append(Child(pid, _start_ticks(pid)))
        self._write()

    def _write(self) -> None:
        children = [{"pid": c.pid, "start": c.start} for c in self.children]
        with contextlib.suppress(OSError):
            if run_dir_usable():
                replace_file(self.path, json.dumps({**self.data, "children": children}))

    def overlaps(self) -> list[dict[str, object]]:
        """Captures of the same target that a --force run started while this one ran."""
        found = []
        for path in sorted(RUN_DIR.glob(f"{os.getpid()}.overlap-*")) if run_dir_usable() else []:
            with contextlib.suppress(OSError, ValueError):
                found.append(json.loads(path.read_text()))
        return found

    def __enter__(self) -> RunRecord:
        self._write()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.keep:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        for notice in RUN_DIR.glob(f"{os.getpid()}.overlap-*") if run_dir_usable() else []:
            with contextlib.suppress(OSError):
                notice.unlink()


def run_dir_usable() -> bool:
    """Create RUN_DIR if needed; False when it is a link, or another user owns or may write to
    it (records and locks there would be theirs to forge)."""
    with contextlib.suppress(OSError):
        RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        info = os.lstat(RUN_DIR)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def live_captures(target_pid: int, target_start: int) -> list[dict[str, object]]:
    """Run records of other profkit processes, still alive, capturing this target."""
    found = []
    for path in RUN_DIR.glob("*.json") if run_dir_usable() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        owner = int(data.get("owner", 0))
        if (
            owner != os.getpid()
            and data.get("target") == target_pid
            and data.get("target_start") == target_start
            and _start_ticks(owner) == data.get("owner_start")
        ):
            found.append({"pid": owner, "bundle": data.get("bundle")})
    return found


def _try_lock(path: Path) -> int | None:
    """The descriptor holding an exclusive flock on path, or None while another process has it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        # Its last holder may have unlinked it between the open and the lock: lock the file
        # that the name leads to now, or two captures would each hold a lock of their own.
        try:
            same = os.lstat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)


@contextlib.contextmanager
def target_lock(
    target_pid: int, target_start: int, bundle: Path, force: bool
) -> Iterator[list[dict[str, object]]]:
    """Hold this target's capture lock; yields the captures that overlap this one (only with
    force, else a second capture raises TargetBusy)."""
    if not run_dir_usable():
        if os.geteuid() == 0:
            raise OutputError(f"{RUN_DIR} is not a directory only root may write to")
        yield []  # another user has no shared place to lock in; root's captures are not seen
        return
    path = RUN_DIR / f"target-{target_pid}-{target_start}.lock"
    fd = _try_lock(path)
    others: list[dict[str, object]] = []
    if fd is None:
        others = live_captures(target_pid, target_start)
        # The holder writes its run record only once its bundle exists: its pid is in the lock.
        with contextlib.suppress(OSError, ValueError):
            holder = int(path.read_text())
            if holder not in {o["pid"] for o in others} and _start_ticks(holder) is not None:
                others.append({"pid": holder, "bundle": None})
        who = ", ".join(
            f"profkit pid {o['pid']}" + (f" into {o['bundle']}" if o["bundle"] else "")
            for o in others
        )
        if not force:
            raise TargetBusy(
                f"pid {target_pid} is already being captured ({who or 'by another profkit'}); "
                "a second capture would double its cost (--force runs it anyway)"
            )
        for other in others:
            with contextlib.suppress(OSError):
                write_new(
                    RUN_DIR / f"{other['pid']}.overlap-{os.getpid()}",
                    json.dumps({"pid": os.getpid(), "bundle": str(bundle)}),
                )
    try:
        yield others
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                path.unlink()
            os.close(fd)


def clean_stale() -> list[Cleanup]:
    """Undo what captures whose profkit died left behind; say what was done."""
    done: list[Cleanup] = []
    if not RUN_DIR.is_dir():
        return done
    if not run_dir_usable():
        return done
    for notice in RUN_DIR.glob("*.overlap-*"):
        owner = int(notice.name.split(".", 1)[0]) if notice.name.split(".")[0].isdigit() else 0
        if not owner or _start_ticks(owner) is None:
            with contextlib.suppress(OSError):
                notice.unlink()
    for path in RUN_DIR.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        owner = int(data.get("owner", 0))
        if owner and _start_ticks(owner) == data.get("owner_start"):
            continue  # that capture is still running
        actions = []
        for child in data.get("children", []):
            pid, start = int(child["pid"]), child.get("start")
            if start is not None and _start_ticks(pid) == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    actions.append(f"killed leftover tool {pid}")
        target, target_start = int(data.get("target", 0)), data.get("target_start")
        if target and _start_ticks(target) == target_start:
            stopped = [tid for tid in _tids(target) if _state(target, tid) in ("T", "t")]
            if stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signal.SIGCONT)
                actions.append(f"resumed target {target} ({len(stopped)} threads were stopped)")
        bundle = Path(str(data.get("bundle", "")))
        if data.get("bundle"):
            actions += mark_aborted(bundle, data.get("bundle_inode"))
        with contextlib.suppress(OSError):
            path.unlink()
        done.append(Cleanup(owner, tuple(actions)))
    return done


def _tids(pid: int) -> list[int]:
    try:
        return procfs.list_tids(pid)
    except FileNotFoundError:
        return []


def _state(pid: int, tid: int) -> str:
    try:
        return procfs.read_stat(pid, tid).state
    except FileNotFoundError:
        return ""


def mark_aborted(
    bundle: Path, inode: list[int] | None, reason: str = "profkit was killed during the capture"
) -> list[str]:
    """Mark a dead capture's bundle aborted and remove its perf.data (every process's samples),
    only if the name still leads to the directory profkit created and only root may write."""
    try:
        fd = os.open(bundle, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    actions = []
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return []
        if inode is not None and [info.st_dev, info.st_ino] != list(inode):
            return []
        held = held_directory(fd)
        try:
            content = json.loads((held / MANIFEST).read_text())
        except (OSError, ValueError):
            return []
        # A bundle that was finished keeps what it kept (perf.data with --perf-scope thread).
        if not isinstance(content, dict) or content.get("status") not in ("capturing", "aborted"):
            return []
        try:
            (held / PERF_DATA).unlink()
        except OSError:
            pass
        else:
            actions.append(f"removed {bundle / PERF_DATA}")
        if content.get("status") == "capturing":
            content["status"] = "aborted"
            content["status_reason"] = reason
            with contextlib.suppress(OSError):
                replace_file(held / MANIFEST, json.dumps(content, indent=2))
                actions.append(f"marked {bundle} aborted")
    finally:
        os.close(fd)
    return actions
