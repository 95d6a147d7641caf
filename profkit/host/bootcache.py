"""Facts of this machine that hold until it reboots, kept for the next capture.

Two start-up measurements cost every capture CPU for an answer that does not change while the
machine runs: the index of the kernel's BTF types (the CO-RE loader's relocations read it) and
the calibration of the traps (ebpf/costs.py). Each is kept here once made: the BTF index under
the digest of the BTF it indexes, the calibration for an hour (it is a measurement: it is made
again now and then, so that a slow first one does not rule every capture after it).

Only root keeps anything, in a directory root owns and no one else may enter
(/run/profkit/boot, 0700, beside the run records), held open by descriptor: a directory of the
wrong owner or mode, a link, or a file not root's is not read or written, and the capture
measures afresh. Every name carries the boot's id, so an entry of an earlier boot is never read
where /run outlives a reboot; a write removes the entries of other boots.
"""

from __future__ import annotations

import contextlib
import os
import stat
from functools import lru_cache
from pathlib import Path

DIRECTORY = Path("/run/profkit/boot")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_BYTES = 16 << 20  # an entry larger than any index a kernel's BTF gives is not read


def boot_id() -> str:
    with contextlib.suppress(OSError):
        return BOOT_ID.read_text().strip().replace("-", "")
    return ""


class BootCache:
    """get(name) and put(name, data) in the held directory; both do nothing (None) where it
    cannot be used, and say why in `reason`."""

    def __init__(self, directory: Path = DIRECTORY) -> None:
        self.directory = directory
        self.reason = ""
        self._boot = boot_id()
        self._fd = -1

    def _held(self) -> int:
        if self._fd >= 0:
            return self._fd
        if os.geteuid() != 0:
            self.reason = "not root"
        elif not self._boot:
            self.reason = f"{BOOT_ID} is unreadable"
        else:
            for directory in (self.directory.parent, self.directory):
                with contextlib.suppress(OSError):
                    os.mkdir(directory, 0o700)
            try:
                fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError as exc:
                self.reason = f"{self.directory}: {exc.strerror}"
                return -1
            held = os.fstat(fd)
            if held.st_uid != 0 or held.st_mode & 0o077:
                os.close(fd)
                self.reason = (
                    f"{self.directory} is not root's alone (owner {held.st_uid}, "
                    f"mode {stat.S_IMODE(held.st_mode):o})"
                )
                return -1
            self._fd = fd
        return self._fd

    def _name(self, name: str) -> str:
        return f"{name}.{self._boot}"

    def get(self, name: str) -> bytes | None:
        fd = self._held()
        if fd < 0:
            return None
        try:
            file = os.open(self._name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None
        try:
            held = os.fstat(file)
            if not stat.S_ISREG(held.st_mode) or held.st_uid != 0 or held.st_size > MAX_BYTES:
                return None
            return os.read(file, held.st_size + 1)[: held.st_size]
        finally:
            os.close(file)

    def put(self, name: str, data: bytes) -> None:
        """Write under a new name, then rename over the entry: a reader sees the old entry or
        the new one, never part of one."""
        fd = self._held()
        if fd < 0:
            return
        temporary = f".{self._name(name)}.{os.getpid()}"
        try:
            file = os.open(temporary, NEW_FILE, 0o600, dir_fd=fd)
            try:
                os.write(file, data)
            finally:
                os.close(file)
            os.replace(temporary, self._name(name), src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=fd)
            return
        self._prune(fd)

    def _prune(self, fd: int) -> None:
        """Remove the entries of other boots, and what a writer that died left half-written."""
        with contextlib.suppress(OSError):
            for entry in os.listdir(fd):
                if entry.startswith("."):
                    stale = not _alive(entry.rsplit(".", 1)[-1])
                else:
                    stale = not entry.endswith(f".{self._boot}")
                if stale:
                    with contextlib.suppress(OSError):
                        os.unlink(entry, dir_fd=fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _alive(pid: str) -> bool:
    """Whether a process with this pid exists (one of another user's too)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    return True


@lru_cache(maxsize=1)
def shared() -> BootCache:
    """The process's one cache (its directory held open once)."""
    return BootCache()
