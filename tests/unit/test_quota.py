"""The quota diagnosis on a cgroup that sets no quota, without a process."""

from __future__ import annotations

from profkit.host import cgroup
from profkit.host.quota import diagnose


def test_diagnosis_without_quota() -> None:
    cg = cgroup.CgroupCpu("v2", "/", cgroup.Path("/nonexistent"), ())
    report = diagnose(cg, None, cpus_allowed=16, pool=16, pool_source="visible CPUs")
    assert report.effective_cores is None and report.source is None
    assert not report.oversubscribed and report.recommended_threads == 16
