"""The quota groups that recipes and tests run in: a real cgroup, its quota and its weight."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from profkit.host.sandbox import HIGHEST_WEIGHT, WEIGHT_FILE, quota_group

pytestmark = pytest.mark.root


def test_a_favoured_group_has_the_highest_weight_and_its_quota() -> None:
    with quota_group(0.5, favoured=True) as favoured, quota_group(0.5) as plain:
        weight = WEIGHT_FILE[favoured.version]
        assert int((favoured.limited / weight).read_text()) == HIGHEST_WEIGHT[favoured.version]
        # A plain group keeps the kernel's default weight: 1024 shares (v1), 100 (v2).
        assert int((plain.limited / weight).read_text()) == (1024 if plain.version == "v1" else 100)
        if favoured.version == "v1":
            assert (favoured.limited / "cpu.cfs_quota_us").read_text().strip() == "50000"
        else:
            assert (favoured.limited / "cpu.max").read_text().split() == ["50000", "100000"]
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            preexec_fn=lambda: favoured.add(os.getpid()),
        )
        try:
            procs = (favoured.leaf_dirs[0] / "cgroup.procs").read_text().split()
            assert str(child.pid) in procs
        finally:
            child.kill()
            child.wait()
        created = favoured.created
    assert not any(directory.exists() for directory in created)
