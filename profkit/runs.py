"""A record of every capture in progress, so that a profkit killed outright can be cleaned up.

Each capture writes /run/profkit/<profkit pid>.json (mode 0600) with its target and the child
tools it started, and removes it when it ends. The next profkit run finds records whose owner is
gone and undoes what could be left: child tools still running are killed (after checking their
start time, so that a reused pid is never touched), a target left stopped is resumed, the
bundle is marked aborted. eBPF probes need nothing: profkit attaches them through perf events,
which the kernel removes with the dead process's file descriptors.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from . import procfs

RUN_DIR = Path(os.environ.get("PROFKIT_RUN_DIR", "/run/profkit"))


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

    def __init__(self, target_pid: int, target_start: int, bundle: Path) -> None:
        self.path = RUN_DIR / f"{os.getpid()}.json"
        self.data: dict[str, object] = {
            "owner": os.getpid(),
            "owner_start": _start_ticks(os.getpid()),
            "target": target_pid,
            "target_start": target_start,
            "bundle": str(bundle),
            "children": [],
        }

    def add_child(self, pid: int) -> None:
        children = self.data["children"]
        assert isinstance(children, list)
        children.append({"pid": pid, "start": _start_ticks(pid)})
        self._write()

    def _write(self) -> None:
        with contextlib.suppress(OSError):
            RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(self.data, handle)
            temporary.replace(self.path)

    def __enter__(self) -> RunRecord:
        self._write()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def clean_stale() -> list[Cleanup]:
    """Undo what captures whose profkit died left behind; say what was done."""
    done = []
    if not RUN_DIR.is_dir():
        return done
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
        manifest = bundle / "manifest.json"
        with contextlib.suppress(OSError, ValueError):
            content = json.loads(manifest.read_text())
            if content.get("status") == "capturing":
                content["status"] = "aborted"
                content["status_reason"] = "profkit was killed during the capture"
                manifest.write_text(json.dumps(content, indent=2))
                actions.append(f"marked {bundle} aborted")
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
