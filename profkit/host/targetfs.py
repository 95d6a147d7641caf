"""Reading a file that a target names, as the target itself could and no further.

profkit runs as root and reads names a target hands it: its code objects' file names, the
service-account file under its root. A name is untrusted input, so every such read goes
through `read_target_file`:

- resolved inside the target's root (`openat2` with RESOLVE_IN_ROOT: `..` and absolute symbolic
  links stop at the target's `/`, never reach the agent's), with no magic links and O_NOFOLLOW on
  the last component;
- opened O_NONBLOCK, so that a FIFO cannot hang the open, and kept only when `fstat` says it is
  a regular file (no devices, FIFOs or sockets);
- opened with the target's own credentials: a short-lived thread takes the target's fsuid, fsgid
  and groups and drops its effective capabilities before the open (Linux keeps credentials per
  thread; the thread ends with them), so root reads nothing the target could not (a user other
  than root opens as itself);
- read to a byte bound: a larger file is refused, not truncated.

Kernels before 5.6 have no `openat2`: there nothing is read (the reason says so).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import threading
from dataclasses import dataclass

from . import procfs

MAX_SOURCE_BYTES = 4 * 1024 * 1024
MAX_SMALL_FILE_BYTES = 64 * 1024
# A source line is shown, not parsed: longer lines are cut, files beyond the count not read.
MAX_LINE_CHARS = 200
MAX_SOURCE_FILES = 2000

# openat2's resolve flags (linux/openat2.h).
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY

# Per-thread system calls by number: glibc's wrappers of setgroups (and setuid and friends)
# apply to every thread of the process, the raw calls to the calling thread alone.
_SYSCALLS = {
    "x86_64": {"setgroups": 116, "setfsuid": 122, "setfsgid": 123, "capget": 125, "capset": 126},
    "aarch64": {"setgroups": 159, "setfsuid": 151, "setfsgid": 152, "capget": 90, "capset": 91},
}
SYS_OPENAT2 = 437  # the same number on every architecture (added after the tables were unified)
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class TargetFileError(OSError):
    """A target-named file profkit will not read; str() says why in a few words."""


@dataclass(frozen=True)
class Credentials:
    uid: int
    gid: int
    groups: tuple[int, ...]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def credentials(pid: int) -> Credentials:
    """The target's filesystem uid and gid and its supplementary groups (/proc/PID/status)."""
    fields: dict[str, list[str]] = {}
    for line in (procfs.PROC / str(pid) / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    try:
        # Real, effective, saved, filesystem: the kernel checks file access with the last.
        return Credentials(
            uid=int(fields["Uid"][3]),
            gid=int(fields["Gid"][3]),
            groups=tuple(int(g) for g in fields.get("Groups", [])),
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise TargetFileError(f"cannot read the credentials of pid {pid}") from exc


def _syscall(name: str, *args: object) -> int:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise TargetFileError(errno.ENOSYS, f"no per-thread credentials on {platform.machine()}")
    return int(_libc.syscall(ctypes.c_long(numbers[name]), *args))


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise TargetFileError(err, f"{what}: {os.strerror(err)}")
    return result


def _become(creds: Credentials) -> None:
    """This thread only: the target's file credentials and no effective capability."""
    groups = (ctypes.c_uint32 * max(1, len(creds.groups)))(*creds.groups)
    _check(_syscall("setgroups", ctypes.c_size_t(len(creds.groups)), groups), "setgroups")
    _syscall("setfsgid", ctypes.c_uint32(creds.gid))  # returns the previous value, never fails
    _syscall("setfsuid", ctypes.c_uint32(creds.uid))
    if _syscall("setfsuid", ctypes.c_uint32(0xFFFFFFFF)) != creds.uid:  # -1 reads it back
        raise TargetFileError(errno.EPERM, "setfsuid did not take")
    # A target running as root keeps uid 0; without capabilities it still cannot read past
    # what its own capabilities allow (CAP_DAC_OVERRIDE, CAP_SYS_PTRACE for /proc files).
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_syscall("capget", ctypes.byref(header), data), "capget")
    for word in data:
        word.effective = 0
    _check(_syscall("capset", ctypes.byref(header), data), "capset")


def _openat2(dirfd: int, name: str) -> int:
    how = _OpenHow(OPEN_FLAGS, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    result = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(name)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if result < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise TargetFileError(err, "this kernel has no openat2 (Linux 5.6 or later)")
        raise TargetFileError(err, os.strerror(err))
    return int(result)


def _open_as(creds: Credentials, dirfd: int, name: str) -> int:
    """openat2 on a thread of its own that holds the target's credentials while it lives.
    A user other than root opens with its own credentials: it reads no more than it may."""
    if os.geteuid() != 0:
        return _openat2(dirfd, name)
    outcome: list[int | BaseException] = []

    def run() -> None:
        try:
            _become(creds)
            outcome.append(_openat2(dirfd, name))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=run, name="profkit-target-open", daemon=True)
    worker.start()
    worker.join()
    result = outcome[0] if outcome else TargetFileError("the open thread died")
    if isinstance(result, BaseException):
        raise result
    return result


def open_target_file(pid: int, name: str, creds: Credentials | None = None) -> int:
    """A descriptor on a regular file the target names, opened as the target would.

    An absolute name resolves in the target's root, a relative one in its working directory
    (which then acts as its root: `..` does not leave it). Raises TargetFileError."""
    if not name or "\0" in name:
        raise TargetFileError(errno.EINVAL, "not a file name")
    creds = creds if creds is not None else credentials(pid)
    base = "root" if name.startswith("/") else "cwd"
    try:
        dirfd = os.open(f"/proc/{pid}/{base}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise TargetFileError(exc.errno or errno.ESRCH, f"cannot open the target's {base}") from exc
    try:
        fd = _open_as(creds, dirfd, name.lstrip("/") or ".")
    finally:
        os.close(dirfd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TargetFileError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_target_file(
    pid: int, name: str, limit: int = MAX_SOURCE_BYTES, creds: Credentials | None = None
) -> bytes:
    """At most `limit` bytes of a regular file the target names; larger files are refused."""
    fd = open_target_file(pid, name, creds)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except BlockingIOError as exc:  # a regular file never says so; something odd did
        raise TargetFileError(errno.EAGAIN, "the file would block") from exc
    finally:
        os.close(fd)
    if size > limit:
        raise TargetFileError(errno.EFBIG, f"larger than {limit} bytes")
    return b"".join(chunks)


class SourceLines:
    """Source lines of the target's files, read as the target could ."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._files: dict[str, list[str] | None] = {}
        self._creds: Credentials | None = None

    def line(self, filename: str, line: int) -> str | None:
        if filename not in self._files:
            self._files[filename] = self._read(filename)
        lines = self._files[filename]
        if not lines or not 0 < line <= len(lines):
            return None
        return lines[line - 1].strip()[:MAX_LINE_CHARS] or None

    def _read(self, filename: str) -> list[str] | None:
        if filename.startswith("<") or len(self._files) > MAX_SOURCE_FILES:
            return None
        try:
            if self._creds is None:
                self._creds = credentials(self.pid)
            data = read_target_file(self.pid, filename, MAX_SOURCE_BYTES, self._creds)
        except OSError:
            return None
        return data.decode(errors="replace").splitlines()
