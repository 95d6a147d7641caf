"""The session bundle: the one thing capture writes and analysis reads.

A directory holding manifest.json and each collector's raw and normalised files. It is written
mode 0700/0600 since it holds the target's command line and thread settings. The manifest says
what was NOT captured and why, so a reader never mistakes a missing collector for a zero.
"""

from __future__ import annotations

import json
import os
import platform
import stat
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import OutputError
from ..host.target import Target, pool_threads
from .parts import (
    EBPF,
    MANIFEST,
    NATIVE,
    PERF,
    PERF_DATA,
    PERF_STAT,
    PERF_STAT_CSV,
    PYSPY,
    PYSPY_TRACES,
    SCHEMA_VERSION,
    TOOL_STDOUT,
    CollectorResult,
)
from .safefile import replace_file


def create_directory(path: Path) -> int:
    """Create the bundle directory (or take an empty one this user owns) and hold it open.

    Returns its descriptor; every write goes through it (safefile.held_directory), so that a
    name renamed or replaced after this check is never followed. A link, or a directory another
    user owns or may write to, is refused: its owner could plant links in it for root to write
    through. A directory profkit did not create is never chmod'ed.
    """
    try:
        existing: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        existing = None
    except OSError as exc:
        raise OutputError(f"cannot use {path}: {exc.strerror}") from exc
    if existing is not None:
        _check_existing(path, existing)
    else:
        try:
            path.mkdir(parents=True, exist_ok=False, mode=0o700)
        except FileExistsError as exc:
            raise OutputError(f"{path} appeared while profkit was creating it") from exc
        except OSError as exc:
            raise OutputError(f"cannot create {path}: {exc.strerror}") from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        opened = os.fstat(fd)
    except OSError as exc:
        raise OutputError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        named = os.lstat(path)
        if (opened.st_dev, opened.st_ino) != (named.st_dev, named.st_ino) or (
            existing is not None
            and (opened.st_dev, opened.st_ino) != (existing.st_dev, existing.st_ino)
        ):
            raise OutputError(f"{path} was replaced while profkit opened it")
        _check_existing(path, opened)
        if os.listdir(fd):
            raise OutputError(f"output directory {path} exists and is not empty")
    except OSError as exc:
        os.close(fd)
        raise OutputError(f"cannot use {path}: {exc.strerror}") from exc
    except OutputError:
        os.close(fd)
        raise
    return fd


def check_output(path: Path) -> None:
    """The refusals of create_directory that need nothing created, made before anything starts
    (create_directory checks again on what it opens)."""
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot use {path}: {exc.strerror}") from exc
    _check_existing(path, existing)
    try:
        if any(path.iterdir()):
            raise OutputError(f"output directory {path} exists and is not empty")
    except OSError as exc:
        raise OutputError(f"cannot use {path}: {exc.strerror}") from exc


def _check_existing(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise OutputError(f"{path} is a symbolic link; name the directory itself")
    if not stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{path} exists and is not a directory")
    if info.st_uid != os.geteuid():
        raise OutputError(
            f"{path} is owned by uid {info.st_uid}, not by the user running profkit "
            f"(uid {os.geteuid()}); its owner could plant links in it"
        )
    if info.st_mode & 0o022:
        raise OutputError(
            f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "they could plant links in it"
        )


def default_directory(pid: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("profkit-sessions") / f"{pid}-{stamp}"


def target_record(
    target: Target,
    thread_names: dict[int, str],
    torch_version: str | None,
    python_names: dict[int, str] | None = None,
) -> dict[str, object]:
    """The manifest's target. A thread's name is the one Python's threading gave it where it
    has one (host/pythreads.py), else the kernel's comm, which `comm` keeps either way."""
    python_names = python_names or {}
    pool, source = pool_threads(target)
    return {
        "pid": target.pid,
        "start_ticks": target.start_ticks,
        "cmdline": list(target.cmdline),
        "exe": target.exe,
        "threads": [
            {"tid": tid, "name": python_names.get(tid, name), "comm": name}
            for tid, name in sorted(thread_names.items())
        ],
        "runtimes": [{"name": r.name, "path": r.path} for r in target.runtimes],
        "openmp_runtime": target.openmp_runtime.path if target.openmp_runtime else None,
        "torch": target.has_torch,
        "torch_dir": target.torch_dir,
        "torch_version": torch_version,
        "thread_env": target.thread_env,
        "pool_threads": pool,
        "pool_threads_source": source,
        "cpus_allowed": target.cpus_allowed,
    }


def torch_version_of(target: Target) -> str | None:
    """Read torch's version from its install, without importing anything from the target."""
    if not target.torch_dir:
        return None
    try:
        text = (Path(target.torch_dir) / "version.py").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


def host_record() -> dict[str, object]:
    return {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "hostname": platform.node(),
    }


def write_manifest(directory: Path, manifest: dict[str, object]) -> None:
    path = directory / MANIFEST
    try:
        replace_file(path, json.dumps(manifest, indent=2))
    except OSError as exc:
        raise OutputError(f"cannot write {MANIFEST}: {exc.strerror}") from exc


def collector_record(result: CollectorResult) -> dict[str, object]:
    return asdict(result)


def new_manifest(
    target: dict[str, object], quota: dict[str, object] | None, options: dict[str, object]
) -> dict[str, object]:
    return {
        "schema_version": SCHEMA_VERSION,
        "profkit_version": __version__,
        "created_unix": time.time(),
        "status": "capturing",
        "status_reason": "",
        "host": host_record(),
        "target": target,
        "quota": quota,
        "options": options,
        "window": {},
        "collectors": {},
    }


def directory_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# What goes first when a bundle is over --max-size: raw artifacts analysis does not need, then
# the eBPF scheduler slices (timeline detail), then whole normalised files, least needed first.
RAW_ARTIFACTS = (PERF_DATA, PYSPY_TRACES, PERF_STAT_CSV, TOOL_STDOUT)
NORMALISED_ORDER = (PERF_STAT, PERF, NATIVE, PYSPY, EBPF)


def _shrink_ebpf(directory: Path) -> bool:
    path = directory / EBPF
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not data.get("slices", {}).get("tid"):
        return False
    data["slices"] = {key: [] for key in data["slices"]}
    data["slices_dropped_for_size"] = True
    replace_file(path, json.dumps(data))
    return True


def enforce_max_size(directory: Path, max_bytes: int) -> list[str]:
    """Bring the bundle under max_bytes; returns what was dropped, in order."""
    dropped: list[str] = []
    for pattern in RAW_ARTIFACTS:
        for path in sorted(directory.glob(pattern)):
            if directory_size(directory) <= max_bytes:
                return dropped
            path.unlink()
            dropped.append(path.name)
    if directory_size(directory) > max_bytes and _shrink_ebpf(directory):
        dropped.append(f"{EBPF}:slices")
    for name in NORMALISED_ORDER:
        if directory_size(directory) <= max_bytes:
            break
        path = directory / name
        if path.exists():
            path.unlink()
            dropped.append(name)
    return dropped


def finish_within(
    directory: Path, max_bytes: int, manifest_for: Callable[[list[str]], dict[str, Any]]
) -> dict[str, Any]:
    """Write the final manifest and leave the whole bundle, that manifest included, under
    max_bytes; manifest_for builds it from what was dropped so far.

    The manifest grows with every part dropped (its name, the owner's new status), so it is
    written, the size checked again, and both repeated until nothing more goes. When only the
    manifest and parts that cannot go are left, the bundle stays as it is."""
    degraded: list[str] = []
    while True:
        manifest = manifest_for(list(degraded))
        write_manifest(directory, manifest)
        more = enforce_max_size(directory, max_bytes)
        if not more:
            return manifest
        degraded.extend(more)
