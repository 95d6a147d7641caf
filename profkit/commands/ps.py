"""`profkit ps`: Python processes, which carry torch, their thread pools and their CPU budget."""

from __future__ import annotations

import json

import click

from ..errors import CgroupError
from ..host.cgroup import cpu_cgroup
from ..host.target import Target, pool_threads, python_processes
from ..render.table import table
from .options import json_option


def describe(target: Target) -> dict[str, object]:
    try:
        cg = cpu_cgroup(target.pid)
        cgroup_path, effective = cg.cgroup, cg.effective_cores
    except CgroupError:
        cgroup_path, effective = None, None
    pool, pool_source = pool_threads(target)
    return {
        "pid": target.pid,
        "start_ticks": target.start_ticks,
        "cmdline": list(target.cmdline),
        "torch": target.has_torch,
        "threads": target.threads,
        "runtimes": [
            {"name": r.name, "path": r.path, "bundled_by_torch": r.bundled_by_torch}
            for r in target.runtimes
        ],
        "thread_env": target.thread_env,
        "environ_readable": target.environ_readable,
        "pool_threads": pool,
        "pool_threads_source": pool_source,
        "cgroup": cgroup_path,
        "effective_cores": effective,
    }


@click.command()
@click.option("--match", "-m", help="Only processes whose command line matches this regex.")
@click.option("--all", "show_all", is_flag=True, help="Include Python processes without torch.")
@json_option
def ps(match: str | None, show_all: bool, as_json: bool) -> None:
    """List Python processes, marking those with torch loaded."""
    targets = [t for t in python_processes(match) if show_all or t.has_torch or match]
    described = [describe(t) for t in targets]
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    if not described:
        click.echo("no matching Python processes" + ("" if show_all else " with torch (try --all)"))
        return
    rows = []
    for target, item in zip(targets, described, strict=True):
        runtimes = ",".join(dict.fromkeys(r.name for r in target.runtimes))
        quota = "-" if item["effective_cores"] is None else f"{item['effective_cores']:g}"
        rows.append(
            (
                target.pid,
                "yes" if target.has_torch else "no",
                target.threads,
                item["pool_threads"],
                quota,
                runtimes or "-",
                " ".join(target.cmdline),
            )
        )
    click.echo(
        table(
            ("pid", "torch", "thr", "pool", "quota", "runtimes", "command"),
            rows,
            (7, 5, 4, 4, 5, 22, 40),
        )
    )
