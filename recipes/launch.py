"""How the recipes, the benchmarks and the tests start `profkit attach` and put a process into a
quota group, each built in one place. Importable from the repository root
(`from recipes.launch import ...`): the recipes that import it put the root on sys.path, and
`python -m benchmarks.NAME` and pytest run from there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profkit.host.sandbox import QuotaGroup

Value = int | float | str


def attach_args(
    pid: Value,
    *,
    duration: Value | None = None,
    out: object = None,
    collectors: str | None = None,
    rate: Value | None = None,
    pyspy_mode: str | None = None,
    budget: Value | None = None,
    cpu_budget: Value | None = None,
    ebpf_sched: str | None = None,
    max_size: Value | None = None,
    perf_rate: Value | None = None,
    force: bool = False,
    report: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments after `profkit`: a flag for each keyword given (None leaves profkit's
    default), then `extra` as it is. Values are passed as written, so that tests can hand
    profkit what it must refuse ("nan", "", -5)."""
    args = ["attach", "--pid", str(pid)]
    for flag, value in (
        ("--duration", duration),
        ("--out", out),
        ("--collectors", collectors),
        ("--rate", rate),
        ("--pyspy-mode", pyspy_mode),
        ("--budget", budget),
        ("--cpu-budget", cpu_budget),
        ("--ebpf-sched", ebpf_sched),
        ("--max-size", max_size),
        ("--perf-rate", perf_rate),
    ):
        if value is not None:
            args += [flag, str(value)]
    if force:
        args.append("--force")
    if not report:
        args.append("--no-report")
    return [*args, *extra]


def attach_command(pid: Value, *, python: str = sys.executable, **flags: Any) -> list[str]:
    """`python -m profkit attach ...`: the whole command line, for subprocess."""
    return [python, "-m", "profkit", *attach_args(pid, **flags)]


def join_quota(group: QuotaGroup | None) -> Callable[[], None] | None:
    """A preexec_fn that puts the child into `group` (QuotaGroup.add) before it execs, so that no
    thread of it ever runs outside the quota; None where there is no group."""
    if group is None:
        return None
    return lambda: group.add(os.getpid())
