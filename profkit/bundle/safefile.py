"""Creating files as root without writing through a link someone else planted.

profkit runs as root in directories other users may write to. A path-based write follows a
symbolic link put in its place, so every file profkit writes is either created new with
O_EXCL | O_NOFOLLOW (a planted name makes the write fail rather than land elsewhere), or
written under a fresh name that way and renamed over the destination (rename replaces a link,
never what it points to). The bundle directory is held open by descriptor, and written through
/proc/PID/fd/N, so that a directory renamed or swapped after profkit created it is never
followed to another one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_new(path: Path | str, mode: int = 0o600) -> int:
    """A descriptor on a file that did not exist; FileExistsError or ELOOP if a name is there."""
    return os.open(path, NEW_FILE, mode)


def write_new(path: Path | str, data: str | bytes, mode: int = 0o600) -> None:
    """Write a file that must not exist yet (a planted name or link raises, nothing is written)."""
    payload = data.encode() if isinstance(data, str) else data
    fd = open_new(path, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(payload)


def replace_file(path: Path | str, data: str | bytes, mode: int = 0o600) -> None:
    """Write a fresh file next to path and rename it over path: a link at path is replaced,
    not followed; the file gets exactly `mode`, whatever the umask."""
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    for _ in range(16):
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = open_new(temporary, mode)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"no free temporary name next to {target}")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(payload)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def held_directory(fd: int) -> Path:
    """A path that names the directory open at fd, whatever is later renamed over its name."""
    return Path(f"/proc/{os.getpid()}/fd/{fd}")
