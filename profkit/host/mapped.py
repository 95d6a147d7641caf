"""The files a target maps, read and probed as the very files it mapped.

A path in /proc/PID/maps is a name, not a file. The target can delete or rename what it mapped
and put a link at that name to a file only root may read; profkit runs as root, so following the
name would read, and probe, a file the target could never open (and tell it, through the bundle,
whether that file is a valid library). So no reader and no probe goes by the name:

- every mapped file is reached through /proc/PID/map_files/START-END, which the kernel resolves
  to the mapping's own file: one the target itself opened to map, whatever its name says now;
- before use, what that reaches is checked to be the file the maps line describes (device and
  inode): a mapping replaced since the maps were read is skipped, with a note naming only the
  target's own name for it;
- the path handed to the readers (symbol tables, FDEs, return sites, the interpreter's ELF) and
  to the kernel for uprobes is that map_files path, never the name.

Where a filesystem reports another device through stat than in the maps (btrfs gives each
subvolume an anonymous device of its own), the inode must still agree and both devices must be
anonymous ones (major 0).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

DELETED = " (deleted)"


class UnverifiedFile(OSError):
    """A mapped file that cannot be reached as mapped; str() says why without naming any file
    but the target's own name for it."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    device: int  # os.makedev(major, minor)
    inode: int
    path: str  # as the maps name it, " (deleted)" removed: shown, never opened
    deleted: bool = False


# A line of /proc/PID/maps that names what it maps; anonymous mappings (each thread's stack
# among them: a process of 20 000 threads has 40 000 such lines) are passed over by the regex.
_NAMED = re.compile(
    r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) (\d+) +(\S.*)$",
    re.MULTILINE,
)


def parse_maps(text: str) -> list[Mapping]:
    """The named mappings (files, and the kernel's [heap], [vdso] and the like)."""
    maps = []
    for start, end, perms, offset, major, minor, inode, path in _NAMED.findall(text):
        deleted = path.endswith(DELETED)
        maps.append(
            Mapping(
                int(start, 16),
                int(end, 16),
                perms,
                int(offset, 16),
                os.makedev(int(major, 16), int(minor, 16)),
                int(inode),
                path.removesuffix(DELETED),
                deleted,
            )
        )
    return maps


def read_maps(pid: int) -> list[Mapping]:
    """The process's named mappings; OSError where its maps cannot be read. Read in large
    chunks: the kernel fills each read as far as it goes, and a process of many threads has
    megabytes of maps."""
    fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return parse_maps(b"".join(chunks).decode(errors="surrogateescape"))


@dataclass(frozen=True)
class MappedFile:
    """A file one process maps, known by one of its mappings."""

    pid: int
    mapping: Mapping

    @property
    def path(self) -> str:
        return self.mapping.path

    @property
    def via(self) -> str:
        """The kernel's link to the mapping's own file."""
        return f"/proc/{self.pid}/map_files/{self.mapping.start:x}-{self.mapping.end:x}"

    def checked(self) -> str:
        """A path that reaches the mapped file itself, after checking that it does; raises
        UnverifiedFile where the mapping is gone, was replaced, or is not a regular file."""
        try:
            info = os.stat(self.via)
        except OSError as exc:
            raise UnverifiedFile(
                exc.errno, f"{self.path}: its mapping cannot be reached ({exc.strerror})"
            ) from None
        if not stat.S_ISREG(info.st_mode):
            raise UnverifiedFile(f"{self.path}: the mapped file is not a regular file")
        if not same_file(info, self.mapping):
            raise UnverifiedFile(f"{self.path}: the file mapped there changed")
        return self.via


def same_file(info: os.stat_result, mapping: Mapping) -> bool:
    if info.st_ino != mapping.inode:
        return False
    if info.st_dev == mapping.device:
        return True
    return os.major(info.st_dev) == 0 and os.major(mapping.device) == 0


def mapped_files(pid: int, maps: list[Mapping] | None = None) -> list[MappedFile]:
    """Every file the process maps, each once (by device and inode) in first-seen order, known
    by its mapping of file offset 0 where it has one."""
    found: dict[tuple[int, int], Mapping] = {}
    for m in read_maps(pid) if maps is None else maps:
        if not m.path.startswith("/") or not m.inode:
            continue
        key = (m.device, m.inode)
        if key not in found or (m.offset == 0 and found[key].offset != 0):
            found[key] = m
    return [MappedFile(pid, m) for m in found.values()]


def find(pid: int, path: str, maps: list[Mapping] | None = None) -> MappedFile | None:
    """The file the process maps under this name (the first, where several files are mapped
    under one name: a library deleted and replaced); None where none is."""
    return next((f for f in mapped_files(pid, maps) if f.path == path), None)


def checked_path(pid: int, mapping: Mapping) -> str:
    """MappedFile(pid, mapping).checked()."""
    return MappedFile(pid, mapping).checked()
