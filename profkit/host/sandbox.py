"""Create short-lived child cgroups with a real CPU quota (v1 or v2), for recipes and tests.

The budget may sit on the child itself or on a parent with an unlimited child under it, so that
nested limits can be reproduced. Removal moves any process still inside back to the root first.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import CgroupError
from .cgroup import MOUNTINFO, Mount, parse_mountinfo

PERIOD_US = 100_000
# The highest CPU weight each version accepts (v1 cpu.shares, v2 cpu.weight). A favoured group
# gets the CPU it asks for before any process of default weight, up to its quota: on a busy
# machine the quota, not the competition, is then what limits it.
HIGHEST_WEIGHT = {"v1": 262_144, "v2": 10_000}
WEIGHT_FILE = {"v1": "cpu.shares", "v2": "cpu.weight"}


@dataclass(frozen=True)
class QuotaGroup:
    version: str
    leaf_dirs: tuple[Path, ...]  # one per hierarchy the process joins (v1: cpu and cpuacct)
    created: tuple[Path, ...]  # every directory made, parents first
    limited: Path  # the directory that carries the quota
    cores: float

    def add(self, pid: int) -> None:
        for leaf in self.leaf_dirs:
            (leaf / "cgroup.procs").write_text(str(pid))


def _mounts() -> list[Mount]:
    return parse_mountinfo(MOUNTINFO.read_text())


def _v2_mount_with_cpu(mounts: list[Mount]) -> Mount | None:
    for mount in mounts:
        if mount.version != "v2":
            continue
        try:
            available = (mount.mount_point / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if "cpu" in available:
            return mount
    return None


def _enable_cpu(directory: Path) -> None:
    control = directory / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


@contextmanager
def quota_group(
    cores: float,
    *,
    on_parent: bool = False,
    period_us: int = PERIOD_US,
    name: str | None = None,
    favoured: bool = False,
) -> Iterator[QuotaGroup]:
    """A fresh cgroup whose processes share `cores` CPUs' worth of time per period.

    favoured: the group gets the highest CPU weight, so that it runs up to its quota however
    busy the machine is (a group of default weight competes as one process would, and on a
    loaded machine may never reach the quota that is meant to throttle it)."""
    if os.geteuid() != 0:
        raise CgroupError("creating a cgroup with a CPU quota needs root")
    if cores <= 0:
        raise CgroupError(f"quota must be positive, got {cores} cores")
    created: list[Path] = []
    try:
        group = _create(
            name or f"profkit-{uuid.uuid4().hex[:8]}", cores, on_parent, period_us, created
        )
        if favoured:
            weight = WEIGHT_FILE[group.version]
            (group.limited / weight).write_text(str(HIGHEST_WEIGHT[group.version]))
    except OSError as exc:
        _remove(created)
        raise CgroupError(f"cgroup setup failed: {exc}") from exc
    try:
        yield group
    finally:
        _remove(created)


def _create(
    name: str, cores: float, on_parent: bool, period_us: int, created: list[Path]
) -> QuotaGroup:
    quota_us = max(1000, round(cores * period_us))
    mounts = _mounts()
    v1 = {c: m for m in mounts if m.version == "v1" for c in m.controllers}
    if "cpu" in v1:
        roots = [v1["cpu"].mount_point]
        if "cpuacct" in v1 and v1["cpuacct"].mount_point != v1["cpu"].mount_point:
            roots.append(v1["cpuacct"].mount_point)
        leaves = []
        for root in roots:
            top = root / name
            top.mkdir()
            created.append(top)
            leaf = top
            if on_parent:
                leaf = top / "child"
                leaf.mkdir()
                created.append(leaf)
            leaves.append(leaf)
        limited = roots[0] / name
        (limited / "cpu.cfs_period_us").write_text(str(period_us))
        (limited / "cpu.cfs_quota_us").write_text(str(quota_us))
        return QuotaGroup("v1", tuple(leaves), tuple(created), limited, cores)
    v2 = _v2_mount_with_cpu(mounts)
    if v2 is None:
        raise CgroupError("no cgroup CPU controller is available (v1 cpu or v2 +cpu)")
    _enable_cpu(v2.mount_point)
    top = v2.mount_point / name
    top.mkdir()
    created.append(top)
    leaf = top
    if on_parent:
        _enable_cpu(top)
        leaf = top / "child"
        leaf.mkdir()
        created.append(leaf)
    (top / "cpu.max").write_text(f"{quota_us} {period_us}")
    return QuotaGroup("v2", (leaf,), tuple(created), top, cores)


def _remove(created: list[Path]) -> None:
    for directory in reversed(created):
        root = directory
        while (root.parent / "cgroup.procs").exists():
            root = root.parent
        for _ in range(50):
            try:
                pids = (directory / "cgroup.procs").read_text().split()
            except OSError:
                break
            for pid in pids:
                with contextlib.suppress(OSError):  # the process may have exited meanwhile
                    (root / "cgroup.procs").write_text(pid)
            try:
                directory.rmdir()
                break
            except OSError:
                time.sleep(0.02)


def run_in_quota(cores: float, command: Sequence[str], *, on_parent: bool = False) -> int:
    """Run a command to completion inside a fresh quota group, then remove the group."""
    with quota_group(cores, on_parent=on_parent) as group:
        # Joined before exec, so that no thread of the command ever runs outside the quota.
        process = subprocess.Popen(list(command), preexec_fn=lambda: group.add(os.getpid()))
        try:
            return process.wait()
        except KeyboardInterrupt:
            process.wait()
            return 130
