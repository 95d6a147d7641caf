"""The session bundle: the one thing capture writes and analysis reads.

A directory holding manifest.json and each collector's raw and normalised files. It is written
mode 0700/0600 since it holds the target's command line and thread settings. The manifest says
what was NOT captured and why, so a reader never mistakes a missing collector for a zero.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

from . import __version__
from .collectors.base import CollectorResult
from .errors import BadBundle, OutputError
from .target import Target, pool_threads

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"


def create_directory(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=False, mode=0o700)
    except FileExistsError as exc:
        if any(path.iterdir()):
            raise OutputError(f"output directory {path} exists and is not empty") from exc
        path.chmod(0o700)
    except OSError as exc:
        raise OutputError(f"cannot create {path}: {exc.strerror}") from exc
    return path


def default_directory(pid: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("profkit-sessions") / f"{pid}-{stamp}"


def target_record(
    target: Target, thread_names: dict[int, str], torch_version: str | None
) -> dict[str, object]:
    pool, source = pool_threads(target)
    return {
        "pid": target.pid,
        "start_ticks": target.start_ticks,
        "cmdline": list(target.cmdline),
        "exe": target.exe,
        "threads": [{"tid": tid, "name": name} for tid, name in sorted(thread_names.items())],
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
    temporary = path.with_suffix(".tmp")
    try:
        temporary.write_text(json.dumps(manifest, indent=2))
        temporary.replace(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from exc


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


def load_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise BadBundle(f"{directory} is not a bundle directory")
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise BadBundle(f"{directory} has no {MANIFEST}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadBundle(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or "schema_version" not in manifest:
        raise BadBundle(f"{path} is not a profkit manifest")
    if manifest["schema_version"] > SCHEMA_VERSION:
        raise BadBundle(
            f"{path} has schema {manifest['schema_version']}; this profkit reads "
            f"up to {SCHEMA_VERSION}"
        )
    return manifest


def load_part(directory: Path, name: str) -> dict | None:
    """A collector's normalised file, or None when it was not captured."""
    path = Path(directory) / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadBundle(f"{path} is truncated or corrupt: {exc}") from exc


def directory_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# What goes first when a bundle is over --max-size: raw artifacts analysis does not need, then
# the eBPF scheduler slices (timeline detail), then whole normalised files, least needed first.
RAW_ARTIFACTS = ("perf.data", "pyspy.chrometrace*.json", "perf_stat.csv", "*.stdout")
NORMALISED_ORDER = ("perf_stat.json", "perf.json", "pyspy.json", "ebpf.json")


def _shrink_ebpf(directory: Path) -> bool:
    path = directory / "ebpf.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not data.get("slices", {}).get("tid"):
        return False
    data["slices"] = {key: [] for key in data["slices"]}
    data["slices_dropped_for_size"] = True
    path.write_text(json.dumps(data))
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
        dropped.append("ebpf.json:slices")
    for name in NORMALISED_ORDER:
        if directory_size(directory) <= max_bytes:
            break
        path = directory / name
        if path.exists():
            path.unlink()
            dropped.append(name)
    return dropped
