"""Size thread pools to the CPU budget, the way automaxprocs does for Go.

PyTorch and OpenMP size their pools to the CPUs in the affinity mask; a cgroup quota does not
change that mask, so a container allowed 2 CPUs of time on a 128-CPU host runs 128 threads.
`apply()` sets the pool from the effective quota (the tightest limit on the path to the root).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .errors import CgroupError
from .host.cgroup import cpu_cgroup, recommended_threads

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class ThreadCap:
    threads: int
    reason: str
    variables: dict[str, str]
    torch_set: bool = False

    def describe(self) -> str:
        variables = " ".join(f"{k}={v}" for k, v in self.variables.items())
        torch = f"; torch.set_num_threads({self.threads})" if self.torch_set else ""
        return f"profkit: {variables}{torch}: {self.reason}"


def compute(pid: int | None = None) -> ThreadCap:
    """The cap for a process (default: this one, whose cgroup a child it starts inherits)."""
    pid = pid or os.getpid()
    cpus = len(os.sched_getaffinity(pid))
    try:
        cg = cpu_cgroup(pid)
    except CgroupError:
        cg = None
    limit = cg.effective if cg else None
    threads = recommended_threads(limit.cores if limit else None, cpus)
    if limit:
        reason = (
            f"quota {limit.quota_us}/{limit.period_us} us = {limit.cores:g} CPUs set by "
            f"{limit.cgroup}, {cpus} CPUs visible"
        )
    else:
        reason = f"no CPU quota; {cpus} CPUs visible"
    return ThreadCap(threads, reason, {name: str(threads) for name in THREAD_VARIABLES})


def environment(
    base: dict[str, str] | None = None, pid: int | None = None
) -> tuple[dict[str, str], ThreadCap]:
    """A child environment with the pool variables set from the quota."""
    cap = compute(pid)
    return {**(base if base is not None else os.environ), **cap.variables}, cap


def apply(verbose: bool = True) -> ThreadCap:
    """Cap this process's pools: environment for runtimes not yet started, torch if loaded."""
    cap = compute()
    os.environ.update(cap.variables)
    torch = sys.modules.get("torch")
    torch_set = False
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(cap.threads)
        torch_set = True
    cap = ThreadCap(cap.threads, cap.reason, cap.variables, torch_set)
    if verbose:
        print(cap.describe(), file=sys.stderr)
    return cap
