"""cgroup discovery on synthetic trees: v1, v2, nested limits and namespaced mounts."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.errors import CgroupError
from profkit.host import cgroup

V1_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/cpuacct rw,nosuid - cgroup cgroup rw,cpuacct
32 25 0:28 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_v1(tmp_path: Path, parent_quota: int, child_quota: int) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    mountinfo = V1_MOUNTINFO.replace("/sys/fs/cgroup", str(root))
    write(tmp_path / "mountinfo", mountinfo)
    write(tmp_path / "proc/42/cgroup", "3:cpu:/a/b\n2:cpuacct:/a/b\n0::/\n")
    for directory, quota in (
        (root / "cpu", -1),
        (root / "cpu/a", parent_quota),
        (root / "cpu/a/b", child_quota),
    ):
        write(directory / "cpu.cfs_quota_us", f"{quota}\n")
        write(directory / "cpu.cfs_period_us", "100000\n")
    write(root / "cpu/a/cpu.stat", "nr_periods 10\nnr_throttled 4\nthrottled_time 2000000\n")
    write(root / "cpu/a/b/cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    write(root / "cpuacct/a/cpuacct.usage", "5000000000\n")
    write(root / "cpuacct/a/b/cpuacct.usage", "1000000000\n")
    return tmp_path / "proc", tmp_path / "mountinfo"


def test_v1_tightest_ancestor_wins(tmp_path: Path) -> None:
    proc, mountinfo = fake_v1(tmp_path, parent_quota=50000, child_quota=150000)
    cg = cgroup.cpu_cgroup(42, proc=proc, mountinfo=mountinfo)
    assert cg.version == "v1"
    assert cg.cgroup == "/a/b"
    assert [lim.cgroup for lim in cg.limits] == ["/a/b", "/a"]
    assert cg.effective is not None and cg.effective.cgroup == "/a"
    assert cg.effective_cores == pytest.approx(0.5)
    stat = cgroup.read_cpu_stat(cg)
    # Periods are read where the binding limit is set, and usage for that same group.
    assert (stat.nr_periods, stat.nr_throttled, stat.throttled_ns) == (10, 4, 2_000_000)
    assert stat.usage_ns == 5_000_000_000


def test_v1_child_limit_when_tighter(tmp_path: Path) -> None:
    proc, mountinfo = fake_v1(tmp_path, parent_quota=300000, child_quota=25000)
    cg = cgroup.cpu_cgroup(42, proc=proc, mountinfo=mountinfo)
    assert cg.effective is not None and cg.effective.cgroup == "/a/b"
    assert cg.effective_cores == pytest.approx(0.25)


def test_v1_unlimited(tmp_path: Path) -> None:
    proc, mountinfo = fake_v1(tmp_path, parent_quota=-1, child_quota=-1)
    cg = cgroup.cpu_cgroup(42, proc=proc, mountinfo=mountinfo)
    assert cg.effective is None and cg.effective_cores is None
    assert cg.stat_directory == cg.directory


def test_v2_nested_and_namespaced_root(tmp_path: Path) -> None:
    root = tmp_path / "cg2"
    # A container whose cgroup namespace root is /kubepods/pod1: mount root is that path.
    write(tmp_path / "mountinfo", f"40 30 0:30 /kubepods/pod1 {root} rw - cgroup2 cgroup2 rw\n")
    write(tmp_path / "proc/7/cgroup", "0::/kubepods/pod1/app\n")
    write(root / "cgroup.controllers", "cpuset cpu io memory\n")
    write(root / "cpu.max", "1360000 100000\n")
    write(root / "app/cpu.max", "max 100000\n")
    write(
        root / "cpu.stat",
        "usage_usec 100\nnr_periods 5\nnr_throttled 4\nthrottled_usec 300\n"
        "nr_bursts 1\nburst_usec 7\n",
    )
    write(
        root / "app/cpu.pressure",
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=1500\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=700\n",
    )
    cg = cgroup.cpu_cgroup(7, proc=tmp_path / "proc", mountinfo=tmp_path / "mountinfo")
    assert cg.version == "v2"
    assert cg.effective_cores == pytest.approx(13.6)
    assert cg.effective is not None and cg.effective.cgroup == "/kubepods/pod1"
    stat = cgroup.read_cpu_stat(cg)
    assert stat == cgroup.CpuStat(5, 4, 300_000, 100_000, 1, 7_000)
    pressure = cgroup.read_pressure(cg)
    assert pressure == cgroup.Pressure(1500, 700)


def test_no_cpu_controller(tmp_path: Path) -> None:
    write(tmp_path / "mountinfo", "1 0 0:1 / / rw - ext4 /dev/vda rw\n")
    write(tmp_path / "proc/9/cgroup", "0::/\n")
    with pytest.raises(CgroupError):
        cgroup.cpu_cgroup(9, proc=tmp_path / "proc", mountinfo=tmp_path / "mountinfo")


def test_window_arithmetic() -> None:
    before = cgroup.CpuStat(100, 20, 1_000_000_000, 10_000_000_000, 0, 0)
    after = cgroup.CpuStat(120, 38, 1_900_000_000, 11_000_000_000, 2, 5_000_000)
    window = cgroup.window_between(before, after, 2.0)
    assert window.periods == 20 and window.throttled_periods == 18
    assert window.throttled_periods_pct == pytest.approx(90.0)
    assert window.throttled_seconds == pytest.approx(0.9)
    assert window.usage_cores == pytest.approx(0.5)
    assert (window.bursts, window.burst_seconds) == (2, pytest.approx(0.005))


@pytest.mark.parametrize(
    ("cores", "cpus", "expected"),
    [(0.5, 2, 1), (13.6, 128, 13), (None, 16, 16), (64.0, 16, 16), (2.0, 2, 2)],
)
def test_recommended_threads(cores: float | None, cpus: int, expected: int) -> None:
    assert cgroup.recommended_threads(cores, cpus) == expected
