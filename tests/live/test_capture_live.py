"""`profkit attach` on real recipe processes: every collector, one clock, clean exits."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from profkit.bundle.read import load_bundle
from profkit.capture.budget import DROP, REGION_PROBE_PART, SCHED_TRACE_PART
from profkit.capture.ebpf.policy import MIN_DUTY
from profkit.capture.session import SAMPLERS
from profkit.capture.startup import LONG_STOP_S
from profkit.host import procfs
from recipes.launch import attach_command

from ..support import NO_BTF, ROOT, run_profkit, stale_uprobe_events
from .conftest import Captured, Recipe, StartRecipe, attach
from .copy_kernel import copy_kernel_samples, inside_regions, probed

pytestmark = pytest.mark.root
SIX = ("ebpf", "proc", "cgroup", "perf_stat", "perf_record", "pyspy")
ALL = ("--collectors", "all")


@pytest.fixture(scope="module")
def fanout_capture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """One capture of the fanout recipe (8 threads), shared by the tests below."""
    from .conftest import _start

    out = tmp_path_factory.mktemp("fanout") / "bundle"
    recipe: Recipe = _start(
        [
            str(ROOT / "recipes/shm_fanout.py"),
            "--copy",
            "torch",
            "--threads",
            "8",
            "--report-every",
            "0.02",
            # 24-MB copies: the rate check must keep the region probes on, which the tests
            # below read. At the default 12 MB the recipe started 140-200 regions a second
            # here, at the edge of their part of the budget; paced with a sleep instead, the
            # lighter load let py-spy's attach stop go unseen (the window test below).
            "--tensor-mb",
            "24",
        ],
        None,
        None,
    )
    time.sleep(1.0)
    # Some tests below read what the scheduler tracepoints saw: trace them whatever the budget.
    result = attach(recipe.pid, out, *ALL, "--ebpf-sched", "on")
    # On the bundle's clock: profkit had exited by now.
    (out.parent / "attach_exited_ns").write_text(str(time.monotonic_ns()))
    recipe.stop()
    assert result.returncode == 0, result.stderr
    yield out, recipe


def progress(recipe: Recipe) -> list[tuple[int, int]]:
    return [
        (int(line.split("t_ns=")[1]), int(line.split()[1].split("=")[1]))
        for line in recipe.output.splitlines()
        if line.startswith("progress")
    ]


def test_all_six_collectors_have_data(fanout_capture: Captured) -> None:
    out, _ = fanout_capture
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    for name in SIX:
        result = manifest["collectors"][name]
        assert result["status"] == "ok", (name, result)
        assert result["samples"] > 0, name
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    assert oct((out / "manifest.json").stat().st_mode & 0o777) == "0o600"


def test_startup_and_teardown_are_accounted_for(fanout_capture: Captured) -> None:
    """What starting and stopping cost goes to the manifest, tool by tool. How long they take
    is a measurement, made side by side by benchmarks/attach_span.py (the ranges
    docs/safety.md quotes), not a bound for a test on a shared machine."""
    out, _ = fanout_capture
    manifest = json.loads((out / "manifest.json").read_text())
    ran = {n for n, c in manifest["collectors"].items() if c["status"] in ("ok", "partial")}
    # (A collector the budget dropped during the window was stopped then, not at teardown.)
    dropped = {d["collector"] for d in manifest["budget_decisions"] if d["action"] == DROP}
    teardown = manifest["teardown_s"]
    assert set(teardown) <= ran and ran - set(teardown) <= dropped, teardown
    # Each stop lies between the window's end and profkit's exit: the samplers' one after the
    # other, then the tools' side by side.
    exited_ns = int((out.parent / "attach_exited_ns").read_text())
    after_window_s = (exited_ns - manifest["window"]["end_ns"]) / 1e9
    samplers = sum(seconds for name, seconds in teardown.items() if name in SAMPLERS)
    tools = max(seconds for name, seconds in teardown.items() if name not in SAMPLERS)
    assert 0 < samplers + tools <= after_window_s, (teardown, after_window_s)
    # py-spy read libtorch's symbols and bcc compiled its programs before the window opened.
    assert manifest["startup"]["tools_cpu_s"] > 0.1, manifest["startup"]
    # py-spy and perf were stopped by SIGINT within their grace, and wrote what they had.
    assert all(code == 0 for code in manifest["collectors"]["pyspy"]["notes"]["exit_codes"])
    # (perf re-raises SIGINT once it has written perf.data.)
    perf_exit = manifest["collectors"]["perf_record"]["notes"]["exit_code"]
    assert perf_exit in (0, -signal.SIGINT), manifest["collectors"]["perf_record"]


def test_window_cpu_is_split_by_tool(fanout_capture: Captured) -> None:
    out, _ = fanout_capture
    window = json.loads((out / "manifest.json").read_text())["window"]
    by_tool = window["tools_cpu_by_tool_s"]
    # The live children while the window was open, by their process names.
    assert {"profkit", "py-spy", "perf"} <= set(by_tool), by_tool
    assert sum(by_tool.values()) == pytest.approx(window["tools_cpu_s"], abs=1e-3)
    # Not "> 0": CPU times tick at 10 ms, and py-spy at 2 Hz may use less than one in a window.


def test_the_window_opens_after_pyspys_attach_stop(fanout_capture: Captured) -> None:
    out, _ = fanout_capture
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["collectors"]["pyspy"]["notes"]["native"] == [True]
    # py-spy reading libtorch's symbols holds the target 0.27-0.31 s on 2 cores.
    attach_stop = manifest["startup"]["pyspy_attach_stop_s"]
    assert attach_stop is not None and attach_stop >= LONG_STOP_S, manifest["startup"]


def test_cgroup_sampling_follows_the_quota(fanout_capture: Captured) -> None:
    out, _ = fanout_capture
    cgroup = json.loads((out / "cgroup.json").read_text())
    # Without a quota nothing is throttled, so there is no period to resolve.
    assert cgroup["interval_s"] == (0.1 if cgroup["effective_cores"] else 1.0)


def test_perf_shows_workers_in_the_copy_kernel(fanout_capture: Captured) -> None:
    out, recipe = fanout_capture
    bundle = load_bundle(out)
    assert bundle.perf is not None
    workers = set(np.unique(bundle.perf.tid).tolist()) - {recipe.pid}
    assert len(workers) >= 4
    kernel_tids = set()
    for tid, stack in zip(bundle.perf.tid, bundle.perf.stack, strict=True):
        names = [bundle.perf.frames[f][0] for f in bundle.perf.stacks[int(stack)]]
        if int(tid) != recipe.pid and any("direct_copy_kernel" in n for n in names):
            kernel_tids.add(int(tid))
    assert len(kernel_tids) >= 4, kernel_tids


def test_region_count_matches_copies(fanout_capture: Captured) -> None:
    out, recipe = fanout_capture
    bundle = load_bundle(out)
    assert bundle.sched is not None and bundle.sched.uprobes_attached
    marks = progress(recipe)
    start, end = bundle.window
    inside = [m for m in marks if start <= m[0] <= end]
    assert len(inside) > 10
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    copies = c1 - c0
    regions = int(((bundle.sched.region_start >= t0) & (bundle.sched.region_start <= t1)).sum())
    assert copies > 50
    assert abs(regions - copies) <= 0.05 * copies, (regions, copies)


def test_region_ends_follow_the_workers_copy_work(fanout_capture: Captured) -> None:
    """The end probe sits after the team's final barrier: every region the entry probe saw
    ends, and the workers' samples in the copy kernel fall inside a region."""
    out, recipe = fanout_capture
    ebpf = json.loads((out / "ebpf.json").read_text())
    assert any("region end" in a for a in ebpf["attached"]), ebpf["attached"]
    assert ebpf["region_entries"] - len(ebpf["regions"]["tid"]) <= 2, ebpf["region_entries"]
    bundle = load_bundle(out)
    assert bundle.sched is not None and bundle.perf is not None
    times = probed(bundle, [t for t, _ in copy_kernel_samples(bundle, recipe.pid)])
    assert len(times) >= 20
    assert inside_regions(bundle, times) >= 0.9 * len(times), len(times)


def test_main_thread_wakes_the_workers(fanout_capture: Captured) -> None:
    out, recipe = fanout_capture
    bundle = load_bundle(out)
    assert bundle.sched is not None
    woken = {
        wakee for waker, wakee, count in bundle.sched.wakeups if waker == recipe.pid and count >= 10
    }
    assert bundle.perf is not None
    workers = {int(t) for t in np.unique(bundle.perf.tid)} - {recipe.pid}
    assert len(woken & workers) >= 4, (woken, workers)


def test_proc_threads_sum_to_process_total(fanout_capture: Captured) -> None:
    out, _ = fanout_capture
    bundle = load_bundle(out)
    proc = bundle.proc
    assert proc is not None
    first, last = proc.process_t_ns[0], proc.process_t_ns[-1]
    total = proc.process_ticks[-1] - proc.process_ticks[0]
    threads = 0
    for tid in np.unique(proc.tid):
        rows = proc.tid == tid
        values, times = proc.cpu_ticks[rows], proc.t_ns[rows]
        threads += values[-1] - (values[0] if times[0] == first else 0)
        assert times[-1] == last  # no thread exited: the sum is comparable
    assert total > 100
    assert abs(threads - total) <= 0.02 * total, (threads, total)


def test_proc_reads_the_main_thread_often_and_every_thread_each_second(
    fanout_capture: Captured,
) -> None:
    out, recipe = fanout_capture
    proc = json.loads((out / "proc.json").read_text())
    assert (proc["interval_s"], proc["thread_interval_s"]) == (0.2, 1.0)
    full = np.array(proc["full_t_ns"])
    # Once a second, and once more when the window closed.
    assert np.all(np.diff(full)[:-1] > 0.8e9) and len(full) >= 4
    times, tids = np.array(proc["samples"]["t_ns"]), np.array(proc["samples"]["tid"])
    main = times[tids == recipe.pid]
    assert len(main) >= 3 * len(full), "the main thread is read at every sample"
    for tid in set(tids.tolist()) - {recipe.pid}:
        assert set(times[tids == tid].tolist()) <= set(full.tolist()), tid
    assert len(proc["process"]["t_ns"]) == len(main)
    # The cumulative extras are read at the window's two ends only.
    samples = proc["samples"]
    ends = {int(full[0]), int(full[-1])}
    for t, runtime, vcsw in zip(
        samples["t_ns"], samples["runtime_ns"], samples["vcsw"], strict=True
    ):
        assert (runtime >= 0 and vcsw >= 0) == (t in ends), (t, runtime, vcsw)


def test_pyspy_is_on_the_bundle_clock(fanout_capture: Captured) -> None:
    out, recipe = fanout_capture
    bundle = load_bundle(out)
    assert bundle.pyspy is not None
    assert recipe.pid in bundle.pyspy.names
    notes = json.loads((out / "manifest.json").read_text())["collectors"]["pyspy"]["notes"]
    # py-spy stamps its events with the time since it started, which profkit anchors at the
    # moment it started py-spy: no event can come before that anchor.
    assert bundle.pyspy.start_ns.min() >= notes["anchors_ns"][0]
    # On SIGINT py-spy closes every open slice at the moment it writes its trace, just before
    # it exits; profkit notes when it saw it exit. A wrong anchor moves those last stamps off
    # that moment. (Its first sample is no such fixed point: the gaps between samples are
    # drawn from an exponential distribution, 1 s on average at 1 Hz, so the first one after
    # the window opens comes more than 2 s later in e^-2 = 14% of captures.)
    exited = max(notes["exited_ns"])
    assert exited - 500_000_000 <= bundle.pyspy.end_ns.max() <= exited, notes


def test_capture_without_bcc_says_why(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "4")
    # Neither loader: bcc turned off, and a kernel without BTF for the CO-RE object.
    env = {"PROFKIT_DISABLE_BCC": "1"}
    result = attach(recipe.pid, tmp_path / "b", env=env, duration=2, hide=NO_BTF)
    recipe.stop()  # what follows reads the bundle only
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "b/manifest.json").read_text())
    ebpf = manifest["collectors"]["ebpf"]
    assert ebpf["status"] == "unavailable" and "PROFKIT_DISABLE_BCC" in ebpf["reason"]
    assert "CO-RE cannot load" in ebpf["reason"] and "no BTF" in ebpf["reason"], ebpf
    for name in ("proc", "cgroup", "perf_record", "pyspy"):
        assert manifest["collectors"][name]["status"] == "ok", name
    assert manifest["collectors"]["perf_stat"]["status"] == "skipped"
    report = run_profkit("report", str(tmp_path / "b"), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert "ebpf" in json.loads(report.stdout)["not_captured"]


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _states(pid: int) -> set[str]:
    states = set()
    for tid in procfs.list_tids(pid):
        with contextlib.suppress(FileNotFoundError):
            states.add(procfs.read_stat(pid, tid).state)
    return states


def _cpu_ticks(pid: int) -> int:
    stat = procfs.read_stat(pid)
    return stat.utime_ticks + stat.stime_ticks


def _interrupt(process: subprocess.Popen[str]) -> float:
    """SIGINT to profkit; the seconds from the signal to its exit (not to its pipes' end:
    its output goes to files)."""
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    return time.monotonic() - sent


def _start_attach(
    tmp_path: Path, command: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=err, text=True, env={**os.environ, **(env or {})}
        )


def test_sigint_stops_quickly_and_leaves_nothing(start_recipe: StartRecipe, tmp_path: Path) -> None:
    """Ctrl-C ends a capture within 2 s whatever py-spy is doing. py-spy notices SIGINT only
    at its next sample and then sleeps one more random gap (2 s on average at the 1 Hz asked
    for here, so it is nearly always still sampling when its 0.5 s are over): it is killed,
    and the target it may have held stopped keeps running. perf record and eBPF are not in
    this set: what they take to stop is their own work on what they recorded (perf script
    over perf.data, the native stacks' symbols: 1.5-12 s on a busy 2-core machine), not a wait
    for py-spy; that Ctrl-C with every collector leaves nothing behind is test_safety_live's."""
    recipe = start_recipe("shm_fanout.py", "--threads", "8")
    out = tmp_path / "b"
    process = _start_attach(
        tmp_path,
        attach_command(
            recipe.pid,
            duration=60,
            out=out,
            report=False,
            rate=1,
            collectors="pyspy,perf_stat,proc,cgroup",
        ),
    )
    manifest_path = out / "manifest.json"
    deadline = time.monotonic() + 60
    tools: list[int] = []
    while time.monotonic() < deadline:  # wait until the tools run
        tools = children_of(process.pid)
        if len(tools) >= 2 and manifest_path.exists():
            break
        time.sleep(0.2)
    time.sleep(2.0)
    tools = children_of(process.pid)
    assert len(tools) >= 2, "py-spy and perf stat should be running"
    took = _interrupt(process)
    err = (tmp_path / "stderr").read_text()
    assert took < 2.0, f"profkit took {took:.1f} s from SIGINT to its exit: {err}"
    assert process.returncode == 130, err
    manifest = json.loads(manifest_path.read_text())
    assert manifest["status"] == "partial" and "SIGINT" in manifest["status_reason"]
    pyspy = manifest["collectors"]["pyspy"]
    (exit_code,) = pyspy["notes"]["exit_codes"]
    if exit_code == -signal.SIGKILL:  # cut off: nothing written, and the bundle says why
        assert pyspy["status"] == "failed" and "killed 0.5 s after" in pyspy["reason"], pyspy
        # --native may have been cut off mid-sample: SIGCONT went to the target regardless.
        assert pyspy["notes"]["sigcont_after_kill"] == pyspy["notes"]["native"][0], pyspy
    else:  # it noticed SIGINT in time and wrote its samples
        assert exit_code == 0 and pyspy["status"] == "ok", pyspy
    # Each tool's stop lies inside the wait from the signal to profkit's exit.
    assert max(manifest["teardown_s"].values()) < took, (manifest["teardown_s"], took)
    for tool in tools:
        assert not Path(f"/proc/{tool}").exists() or procfs.read_stat(tool).state == "Z", tool
    # Never left stopped: not now, and not a moment later (a stop signal py-spy's attach left
    # pending would stop the target once its thread runs): it keeps using CPU.
    assert not {"T", "t"} & _states(recipe.pid), _states(recipe.pid)
    ticks = _cpu_ticks(recipe.pid)
    time.sleep(1.0)
    assert not {"T", "t"} & _states(recipe.pid), _states(recipe.pid)
    assert _cpu_ticks(recipe.pid) > ticks, "the target must keep running"
    assert recipe.process.poll() is None, "the target must keep running"


# A target whose main thread waits in the kernel, where a stop signal cannot act yet: its
# posix_spawn (a vfork) waits for the child, which waits to open a FIFO until someone writes.
VFORK_WAITER = """
import os, sys
print("ready", flush=True)
os.posix_spawn(
    "/bin/true", ["true"], os.environ,
    file_actions=[(os.POSIX_SPAWN_OPEN, 0, sys.argv[1], os.O_RDONLY, 0)],
)
print("spawned", flush=True)
while True:
    pass
"""

# A py-spy that ptrace-attaches to the target and then ignores SIGINT: killed after it, the
# SIGSTOP its attach sent is still pending in the waiting thread, and stops the target as soon
# as that thread returns to user space, unless profkit has sent SIGCONT in between.
STUCK_PYSPY = """#!{python}
import ctypes, signal, sys, time
if "--version" in sys.argv:
    print("py-spy 0.4.1")
    sys.exit(0)
signal.signal(signal.SIGINT, signal.SIG_IGN)
pid = int(sys.argv[sys.argv.index("--pid") + 1])
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
    sys.exit(f"ptrace: errno {{ctypes.get_errno()}}")
print("attached", file=sys.stderr, flush=True)
while True:
    time.sleep(1)
"""


def test_sigint_while_pyspy_holds_the_target_leaves_it_running(tmp_path: Path) -> None:
    """py-spy killed between its ptrace attach and the target's stop: the target is not stopped
    yet (/proc shows its thread waiting), but would stop once the thread runs. profkit, having
    killed py-spy --native, sends SIGCONT whatever /proc says, and the target keeps running;
    and a py-spy that never exits on SIGINT holds Ctrl-C up 0.5 s, not 10 gaps."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fake = tmp_path / "py-spy"
    fake.write_text(STUCK_PYSPY.format(python=sys.executable))
    fake.chmod(0o755)
    target = subprocess.Popen(
        [sys.executable, "-c", VFORK_WAITER, str(fifo)], stdout=subprocess.PIPE, text=True
    )
    process = None
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        deadline = time.monotonic() + 10
        while _states(target.pid) != {"D"} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _states(target.pid) == {"D"}, _states(target.pid)
        out = tmp_path / "b"
        process = _start_attach(
            tmp_path,
            attach_command(
                target.pid,
                duration=60,
                out=out,
                report=False,
                collectors="pyspy,proc",
                pyspy_mode="native",
            ),
            env={"PROFKIT_PY_SPY": str(fake)},
        )
        deadline = time.monotonic() + 60
        stderr = out / "pyspy.stderr"
        while time.monotonic() < deadline and process.poll() is None:
            if stderr.exists() and "attached" in stderr.read_text():
                break
            time.sleep(0.1)
        assert "attached" in stderr.read_text(), (tmp_path / "stderr").read_text()
        assert _states(target.pid) == {"D"}, "the stop is pending, not taken"
        took = _interrupt(process)
        err = (tmp_path / "stderr").read_text()
        assert took < 2.0, f"profkit took {took:.1f} s from SIGINT to its exit: {err}"
        assert process.returncode == 130, err
        pyspy = json.loads((out / "manifest.json").read_text())["collectors"]["pyspy"]
        assert pyspy["notes"]["exit_codes"] == [-signal.SIGKILL], pyspy
        assert pyspy["notes"]["sigcont_after_kill"] is True, pyspy
        assert pyspy["status"] == "failed" and "killed 0.5 s after" in pyspy["reason"], pyspy
        # Let the target's thread out of the kernel: a pending SIGSTOP would stop it now.
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(writer)
        time.sleep(1.0)
        assert not {"T", "t"} & _states(target.pid), _states(target.pid)
        assert select.select([target.stdout], [], [], 10)[0], "the target must keep running"
        assert target.stdout.readline().startswith("spawned")
        ticks = _cpu_ticks(target.pid)
        time.sleep(1.0)
        assert _cpu_ticks(target.pid) > ticks, "the target must keep running"
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        target.kill()
        target.wait()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs to pin the target to one")
def test_perf_samples_only_the_cpus_the_target_may_use(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "2")
    for tid in procfs.list_tids(recipe.pid):
        os.sched_setaffinity(tid, {0})
    out = tmp_path / "b"
    result = attach(recipe.pid, out, "--collectors", "perf_record", duration=3.0)
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "manifest.json").read_text())["collectors"]["perf_record"]
    assert record["notes"]["scope"] == "cpu" and record["notes"]["cpus"] == "0"
    assert record["samples"] > 0
    # The per-CPU data held every process's samples: only the target's are kept.
    assert not (out / "perf.data").exists()
    tids = set(json.loads((out / "perf.json").read_text())["samples"]["tid"])
    assert tids <= set(procfs.list_tids(recipe.pid))


def test_thread_scope_keeps_perf_data(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "2")
    out = tmp_path / "b"
    result = attach(
        recipe.pid, out, "--collectors", "perf_record", "--perf-scope", "thread", duration=2.0
    )
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "manifest.json").read_text())["collectors"]["perf_record"]
    assert record["notes"]["scope"] == "thread" and "perf.data" in record["files"]
    assert (out / "perf.data").exists()


# No run of the scheduler's programs takes less than this (each reads the task and updates a
# map or two; ebpf.json's sched.ns_per_switch records what they took): a budget derived from it
# leaves the measured cost over the scheduler's part whatever this machine measures.
FASTEST_SWITCH_S = 100e-9

PING_PONG = """
import os, threading, time
r1, w1 = os.pipe(); r2, w2 = os.pipe()
def pong():
    while True:
        os.read(r1, 1); os.write(w2, b"x")
threading.Thread(target=pong, daemon=True).start()
while True:
    os.write(w1, b"x"); os.read(r2, 1)
"""


def test_a_busy_machine_is_not_traced_at_every_switch(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """How busy a ping-pong makes a machine depends on its CPUs: the budget is derived from the
    switch rate measured here and the least a switch's programs can take (FASTEST_SWITCH_S), so
    that tracing every switch would cost at least four times the scheduler's part of it however
    many CPUs there are (where that is past 100%, 100% leaves the part further below the cost).
    The recipe is paced so that its region probes fit even a small budget."""
    recipe = start_recipe("shm_fanout.py", "--threads", "2", "--pause-ms", "250")
    busy = subprocess.Popen([sys.executable, "-c", PING_PONG])
    try:
        time.sleep(1.0)
        before, start = procfs.read_context_switches(), time.monotonic()
        time.sleep(1.0)
        rate = (procfs.read_context_switches() - before) / (time.monotonic() - start)
        cost = rate * FASTEST_SWITCH_S / (os.cpu_count() or 1)
        budget_pct = min(100.0, 100 * cost / SCHED_TRACE_PART / 4)
        out = tmp_path / "b"
        result = attach(
            recipe.pid,
            out,
            *("--collectors", "ebpf,proc", "--budget", f"{budget_pct:.6f}"),
            duration=2.0,
        )
    finally:
        busy.kill()
        busy.wait()
    assert result.returncode == 0, result.stderr
    decision = json.loads((out / "ebpf.json").read_text())["sched"]
    assert decision["traced"] is False
    assert "scheduler tracepoints skipped" in decision["reason"]
    # The trial measured the programs: no faster than the bound the budget was derived from.
    assert decision["ns_per_switch"] >= FASTEST_SWITCH_S * 1e9, decision
    ebpf = json.loads((out / "ebpf.json").read_text())
    assert ebpf["regions"]["tid"], "the region uprobes still run"
    assert not any("sched:" in a for a in ebpf["attached"]), ebpf["attached"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "scheduler tracepoints skipped" in manifest["collectors"]["ebpf"]["reason"]
    report = run_profkit("report", str(out))
    assert report.returncode == 0, report.stderr
    assert "scheduler tracepoints skipped" in report.stdout


def test_a_flood_of_small_regions_switches_the_region_probes(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """64-KB copies start a region each: on 2 idle cores over a thousand a second, at the few
    microseconds a region is measured to cost, over the probes' part of a 2% budget. How many a
    machine runs is its own (26 a second on 2 cores at a load average of 12), and what a region
    costs is measured by each capture, so every budget below is derived from what the first
    capture measured. A budget whose probes' part covers that keeps them on (the first
    capture's: at --budget 100 the part is 15% of the dispatching thread). One whose part is a
    small share of what the measured rate costs has them switched on and off with the walker
    on, and the pool still gets its call site from the regions of the on-times; one twenty
    times too small for the least duty takes them off, and the report says so. (What the duty
    comes to at a rate the test sets is test_pystacks_live's paced three-site test.)"""
    # A pause of half a millisecond after each copy: under 2 000 regions a second on any
    # machine, and a rate that a busy machine moves less than an unpaced loop's.
    recipe = start_recipe(
        "shm_fanout.py", "--threads", "2", "--tensor-mb", "0.0625", "--pause-ms", "0.5"
    )
    time.sleep(1.0)
    loose, switched, tight = tmp_path / "loose", tmp_path / "switched", tmp_path / "tight"
    result = attach(
        recipe.pid,
        loose,
        *("--collectors", "ebpf,proc", "--ebpf-sched", "off", "--budget", "100"),
        duration=2.0,
    )
    assert result.returncode == 0, result.stderr
    kept = json.loads((loose / "ebpf.json").read_text())
    measured = kept["regions_decision"]
    assert measured["action"] == "keep" and measured["duty"] == 1, measured
    assert measured["expected_cost"] > 0 and measured["cost_per_region_us"] > 0, measured
    # Kept on: every region entered was seen to its end and kept, but for the one the
    # dispatching thread may still be in as they are counted (as in
    # test_region_ends_follow_the_workers_copy_work).
    assert kept["regions"]["tid"] and not kept["regions_decision"].get("on_ns"), measured
    assert kept["region_entries"] - len(kept["regions"]["tid"]) <= 2, kept["region_entries"]
    assert stale_uprobe_events() == []

    def budget(share_of_measured: float) -> str:
        """--budget whose probes' part is this share of what the measured rate costs."""
        part = share_of_measured * measured["expected_cost"]
        return f"{100 * part / REGION_PROBE_PART:.4g}"

    # A part 0.15 of the measured cost: the probes are switched unless this capture's check
    # counts under 0.15 of the rate measured, and taken off only over 7.5 times it (a duty
    # under MIN_DUTY).
    result = attach(
        recipe.pid, switched, "--collectors", "ebpf,proc", "--budget", budget(0.15), duration=3.0
    )
    assert result.returncode == 0, result.stderr
    ebpf = json.loads((switched / "ebpf.json").read_text())
    decision = ebpf["regions_decision"]
    assert decision["action"] == "switch", f"not switched: {decision}; measured first: {measured}"
    assert decision["traced"] is True and decision["duty"] < 1, decision
    on = decision["on_ns"]
    assert on and all(a < b for a, b in on)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(on)), "switched off"
    starts = ebpf["regions"]["start_ns"]
    assert starts, decision
    assert all(any(a <= t <= b for a, b in on) for t in starts), "regions only in on-times"
    assert all(s >= 0 for s in ebpf["regions"]["stack"]), "every region carries its stack"
    assert stale_uprobe_events() == []
    report = run_profkit("report", str(switched), "--format", "json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    pool = next(p for p in data["pools"] if p["runtime"] == "openmp")
    assert 0 < pool["regions_probed"] < 1, pool
    assert pool["regions_with_stack"] == pool["regions"] > 0
    site = next(a for a in data["attribution"] if a["pool"] == "openmp")
    assert "shm_fanout.py:" in site["site"] and site["function"] == "copy_with_torch", site
    assert site["share"] == 1.0 and site["regions"] == pool["regions"], site
    text = run_profkit("report", str(switched))
    words = " ".join(text.stdout.split())  # however the report wraps its lines
    assert "the region probes were on" in words and "to fit the budget" in words, text.stdout
    assert (
        "regions counted in the" in text.stdout
        and "of the window the probes were on" in text.stdout
    )
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
    # A part twenty times too small for the least duty at the measured rate: taken off unless
    # this check counts under a twentieth of it.
    result = attach(
        recipe.pid,
        tight,
        *("--collectors", "ebpf,proc", "--budget", budget(MIN_DUTY / 20)),
        duration=2.0,
    )
    assert result.returncode == 0, result.stderr
    decision = json.loads((tight / "ebpf.json").read_text())["regions_decision"]
    assert decision["traced"] is False and decision["action"] == "detach", decision
    assert not json.loads((tight / "ebpf.json").read_text())["regions"]["tid"]
    report = run_profkit("report", str(tight))
    assert report.returncode == 0, report.stderr
    assert "OpenMP region probes detached" in report.stdout
    assert stale_uprobe_events() == []
    assert recipe.process.poll() is None, "the target keeps running"


def test_fast_demangling_names_every_frame_as_perf_does(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    from profkit.capture import demangle
    from profkit.capture.collectors.perfrecord import parse_script
    from profkit.capture.demangle import rename_frames
    from profkit.host.tools import find_binary

    perf = find_binary("perf")
    if perf is None or not demangle.available():
        pytest.skip("perf or c++filt is not installed")
    recipe = start_recipe("shm_fanout.py", "--copy", "torch", "--threads", "4")
    data = tmp_path / "perf.data"
    # No build-id cache: it would copy libtorch into root's ~/.debug on every fresh install.
    record = [perf, "record", "-q", "--no-buildid-cache", "-a", "-F", "99", "-g", "-o", str(data)]
    record += ["--", "sleep", "2"]
    subprocess.run(record, check=True, capture_output=True)
    recipe.stop()  # perf script reads what was recorded, and the libraries' files

    def script(*extra: str) -> dict:
        fields = ["--no-inline", "--pid", str(recipe.pid), "-F", "tid,time,period,ip,sym,dso"]
        out = subprocess.run(
            [perf, "script", "-i", str(data), *extra, *fields], capture_output=True, text=True
        )
        return parse_script(out.stdout.splitlines(True))

    def named(parsed: dict) -> list[tuple[str, ...]]:
        frames, stacks = parsed["frames"], parsed["stacks"]
        return [tuple(frames[f][0] for f in stacks[s]) for s in parsed["samples"]["stack"]]

    by_perf = script()
    fast = script("--no-demangle")
    fast = rename_frames(fast, demangle.demangle([frame[0] for frame in fast["frames"]]))
    assert named(fast) == named(by_perf)
    assert any(name.startswith("at::") for stack in named(by_perf) for name in stack)
