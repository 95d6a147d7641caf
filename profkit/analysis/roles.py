"""Which thread is what: Python threads, pool workers (and which pool), other native threads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..bundle.read import Bundle
from .frames import ATEN_PARALLEL, OPENMP_DSOS, OPENMP_WAIT, POOL_DSOS

PYTHON, WORKER, OTHER = "python", "pool-worker", "other"
# A thread woken this often by a Python thread, and never seen running Python, serves it.
MIN_WAKEUPS = 5


@dataclass(frozen=True)
class ThreadRole:
    tid: int
    name: str
    role: str
    pool: str | None
    evidence: str


@dataclass(frozen=True)
class Pool:
    name: str  # the kind, "openmp", "openblas", "mkl", "tbb"; "kind@file" for a further copy
    runtime: str | None  # the library path, when known
    workers: tuple[int, ...]
    dispatchers: tuple[int, ...]

    @property
    def kind(self) -> str:
        return self.name.split("@", 1)[0]

    @property
    def team_size(self) -> int:
        # The dispatching thread runs a share of each OpenMP region itself.
        return len(self.workers) + (1 if self.kind == "openmp" else 0)


def _copies(bundle: Bundle) -> dict[str, str | None]:
    """Pool name -> library path of every runtime copy the region probes saw."""
    sched = bundle.sched
    if sched is None or not sched.pool_names:
        return {}
    return {
        name: runtime.get("path")
        for name, runtime in zip(sched.pool_names, sched.runtimes, strict=True)
    }


def _perf_pool_votes(bundle: Bundle, by_path: dict[str, str]) -> dict[int, Counter[str]]:
    """For each thread, which pools its perf samples run in: the runtime copy whose library a
    frame is in (`by_path`), else the pool of that kind."""
    votes: dict[int, Counter[str]] = {}
    perf = bundle.perf
    if perf is None:
        return votes
    stack_pool: list[str | None] = []
    for stack in perf.stacks:
        pool = None
        for frame_id in stack:
            symbol, dso = perf.frames[frame_id]
            if (
                OPENMP_DSOS.search(dso)
                or OPENMP_WAIT.search(symbol)
                or ATEN_PARALLEL.search(symbol)
            ):
                pool = by_path.get(dso, "openmp")
                break
            named = next((n for n, pattern in POOL_DSOS.items() if pattern.search(dso)), None)
            if named:
                pool = by_path.get(dso, named)
                break
        stack_pool.append(pool)
    tids, stacks = perf.tid, perf.stack
    for tid in np.unique(tids):
        counter: Counter[str] = Counter()
        for stack_id in stacks[tids == tid]:
            pool = stack_pool[int(stack_id)]
            if pool:
                counter[pool] += 1
        votes[int(tid)] = counter
    return votes


def _copy_by_slices(bundle: Bundle, tid: int, candidates: list[str]) -> str:
    """Which OpenMP copy a worker known only from wakeups serves, where several ran regions.
    A region ends only once every member of its team reached the closing barrier, so a worker
    was on CPU during nearly every region of its own copy; during another copy's regions only
    when it happened to be spinning or running then. The copy whose regions it covers best."""
    sched = bundle.sched
    if sched is None or len(candidates) < 2:
        return "openmp"
    mine = sched.slice_tid == tid
    order = np.argsort(sched.slice_start[mine])
    starts, ends = sched.slice_start[mine][order], sched.slice_end[mine][order]
    if not len(starts):
        return "openmp"
    latest_end = np.maximum.accumulate(ends)
    coverage: dict[str, float] = {}
    for name in candidates:
        regions = sched.for_pool(name)
        if not len(regions.region_start):
            continue
        # The last slice that started before each region ended, and whether any slice up to
        # it was still running when the region started.
        last = np.searchsorted(starts, regions.region_end) - 1
        ran = (last >= 0) & (latest_end[np.maximum(last, 0)] > regions.region_start)
        coverage[name] = float(ran.mean())
    return max(coverage, key=coverage.__getitem__) if coverage else "openmp"


def classify(
    bundle: Bundle, tids: list[int], names: dict[int, str], busy: set[int] | None = None
) -> tuple[tuple[ThreadRole, ...], tuple[Pool, ...]]:
    """Roles of the threads; `busy` are those that used CPU in the window (for /proc inference)."""
    manifest_target = bundle.manifest.target
    pid = manifest_target.pid or 0
    python_tids = set(bundle.pyspy.names) if bundle.pyspy else set()
    if bundle.pyspy is not None:
        python_tids |= {int(t) for t in np.unique(bundle.pyspy.tid) if t}
    if not python_tids and pid:
        python_tids = {pid}  # without py-spy, the main thread is the one Python thread known
    copies = _copies(bundle)
    votes = _perf_pool_votes(bundle, {path: name for name, path in copies.items() if path})
    woken_by_python: Counter[int] = Counter()
    waker_of: dict[int, Counter[int]] = {}
    if bundle.sched is not None:
        for waker, wakee, count in bundle.sched.wakeups:
            if waker in python_tids and wakee not in python_tids:
                woken_by_python[wakee] += count
                waker_of.setdefault(wakee, Counter())[waker] += count
    openmp_path = manifest_target.openmp_runtime
    blind = bundle.perf is None and (bundle.sched is None or not bundle.sched.scheduler_traced)
    roles: list[ThreadRole] = []
    members: dict[str, list[int]] = {}
    dispatchers: dict[str, Counter[int]] = {}
    for tid in tids:
        name = names.get(tid, "?")
        if tid in python_tids:
            roles.append(ThreadRole(tid, name, PYTHON, None, "py-spy samples Python frames"))
            continue
        counter = votes.get(tid, Counter())
        pool, evidence = None, ""
        if counter:
            pool = counter.most_common(1)[0][0]
            evidence = f"{sum(counter.values())} native samples in the {pool} runtime"
        elif woken_by_python[tid] >= MIN_WAKEUPS and openmp_path:
            pool = _copy_by_slices(bundle, tid, [n for n in copies if n.startswith("openmp")])
            evidence = f"woken {woken_by_python[tid]} times by a Python thread"
            if len(copies) > 1:
                evidence += f", on CPU through the {pool} regions"
        elif blind and openmp_path and name == names.get(pid) and tid in (busy or set()):
            # No native evidence at all: OpenMP workers keep the process's own thread name,
            # while most other libraries name their threads. Weaker, and said so.
            pool = "openmp"
            evidence = (
                "inferred from /proc: an unnamed non-Python thread in a process that "
                "maps an OpenMP runtime (no perf or eBPF data)"
            )
        if pool is None:
            roles.append(ThreadRole(tid, name, OTHER, None, "no pool runtime seen"))
            continue
        if woken_by_python[tid]:
            evidence += f"; woken {woken_by_python[tid]}x by Python threads"
            dispatchers.setdefault(pool, Counter()).update(waker_of[tid])
        roles.append(ThreadRole(tid, name, WORKER, pool, evidence))
        members.setdefault(pool, []).append(tid)
    pools = []
    # A runtime copy that ran regions is a pool even where no worker was seen (a team of one).
    window = bundle.window
    for name in copies:
        assert bundle.sched is not None  # copies come from its region probes
        starts = bundle.sched.for_pool(name).region_start
        if name not in members and ((starts >= window[0]) & (starts <= window[1])).any():
            members[name] = []
    for pool_name, workers in members.items():
        runtime = copies.get(pool_name) or (
            openmp_path
            if pool_name == "openmp"
            else next(
                (r.path for r in manifest_target.runtimes if r.name == pool_name),
                None,
            )
        )
        found = tuple(t for t, _ in dispatchers.get(pool_name, Counter()).most_common())
        pool_regions = bundle.sched.for_pool(pool_name) if bundle.sched is not None else None
        if not found and pool_regions is not None and len(pool_regions.region_tid):
            found = tuple(int(t) for t in np.unique(pool_regions.region_tid))
        if not found and pid in python_tids:
            found = (pid,)  # the main thread, unless the scheduler data says otherwise
        pools.append(Pool(pool_name, runtime, tuple(sorted(workers)), found))
    return tuple(roles), tuple(pools)
