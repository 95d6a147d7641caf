"""Safe on live targets: repeated attach, signals at random moments, targets that go away."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profkit.capture.budget import HANG_S
from profkit.capture.ebpf.placement.regions import find_probes, probeable
from profkit.host import procfs
from profkit.host.target import inspect
from recipes.launch import attach_args, attach_command

from ..support import ROOT, run_profkit, stale_uprobe_events
from .conftest import StartRecipe

pytestmark = pytest.mark.root
ALL = ("--collectors", "all")
# The fan-out recipe paced: tests of what a signal or an exit does to a capture need the pool's
# regions to come and go, not the machine full. Unpaced, its 8 threads hold both cores for the
# whole test, and the other lanes wait behind them.
PACED = ("shm_fanout.py", "--threads", "8", "--pause-ms", "50")


def states(pid: int) -> set[str]:
    out = set()
    for tid in procfs.list_tids(pid):
        try:
            out.add(procfs.read_stat(pid, tid).state)
        except FileNotFoundError:
            continue
    return out


def leftovers(bundle: Path) -> list[str]:
    """Processes whose command line names this bundle, or that run in it: tools profkit started
    for it (their output paths name profkit's descriptor on the bundle, their cwd the bundle)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = procfs.read_stat(int(entry)).state
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except (OSError, ValueError):
            continue
        if (str(bundle) in cmdline or cwd == str(bundle)) and state != "Z":
            found.append(f"{entry}: {cmdline[:120]}")
    return found


def probe_addresses(pid: int) -> list[int]:
    """Every place in the target's memory where profkit puts a region probe."""
    found = []
    maps = [line.split() for line in Path(f"/proc/{pid}/maps").read_text().splitlines()]
    for index, runtime in enumerate(probeable(inspect(pid).runtimes)):
        probes = find_probes(index, runtime)
        if probes is None:
            continue
        # A shared library maps its file at its own offsets: the load bias is the start of the
        # mapping of offset 0.
        base = next(
            int(m[0].split("-")[0], 16)
            for m in maps
            if len(m) >= 6 and m[5] == runtime.path and int(m[2], 16) == 0
        )
        end = [probes.end.address] if probes.end else []
        found += [base + a for a in [e.address for e in probes.entries] + end + [*probes.returns]]
    return found


def code_bytes(pid: int, addresses: list[int]) -> dict[int, int]:
    """The target's instruction byte at each address, read through /proc/PID/mem: 0xCC (int3)
    while a uprobe is there, the library's own byte once it is gone."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        found = {}
        for address in addresses:
            mem.seek(address)
            found[address] = mem.read(1)[0]
        return found


INT3 = 0xCC


# Thirty whole attaches (start-up and teardown included) take 5-10 s each on a quiet 2-core
# machine and up to twice that on a busy one; each has its own hang guard (run_profkit's timeout),
# so the test's own bound only has to cover thirty of them.
@pytest.mark.timeout(900)
def test_attach_detach_thirty_times(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe(*PACED, "--report-every", "0.1", warmup=1.0)
    addresses = probe_addresses(recipe.pid)
    original = code_bytes(recipe.pid, addresses)
    assert original and INT3 not in original.values(), original
    # While a capture runs, its region probes are int3 bytes in the target's code: what the
    # check after the attaches looks for is really there to find.
    running = _attach_background(recipe.pid, tmp_path / "running")
    try:
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline and INT3 not in code_bytes(recipe.pid, addresses).values()
        ):
            time.sleep(0.2)
        assert INT3 in code_bytes(recipe.pid, addresses).values()
    finally:
        running.send_signal(signal.SIGINT)
        running.communicate(timeout=60)
    for index in range(30):
        out = tmp_path / f"b{index}"
        result = run_profkit(
            *attach_args(recipe.pid, duration=0.3, out=out, report=False),
            timeout=120,
        )
        assert result.returncode == 0, (index, result.stderr)
        assert "T" not in states(recipe.pid) and "t" not in states(recipe.pid)
        assert recipe.process.poll() is None
    assert leftovers(tmp_path) == []
    # Nothing of profkit stays in the target: no thread stopped (above), no tool running, and
    # every probed instruction is the library's own again. (Whether the target runs as fast as
    # before is a throughput measurement, made side by side in benchmarks/, not here.)
    assert code_bytes(recipe.pid, addresses) == original


def _attach_background(
    pid: int, out: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        attach_command(pid, duration=60, out=out, report=False, extra=extra),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _holds_perf_events(pid: int) -> bool:
    """Whether the process holds perf event descriptors: its eBPF probes are attached."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]":
                return True
    return False


def _wait_capturing(out: Path, process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until the collectors run: the child tools have started (their stderr is in the bundle),
    or, in a set with none (the default), the eBPF probes are attached."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        manifest = out / "manifest.json"
        if manifest.exists() and (any(out.glob("*.stderr")) or _holds_perf_events(process.pid)):
            return
        time.sleep(0.1)
    raise AssertionError("the capture never started")


def _target_is_running(pid: int) -> None:
    time.sleep(1.0)  # the target must resume within a second
    assert not ({"T", "t"} & states(pid)), states(pid)


def test_sigint_while_the_probes_load_with_sigint_inherited_ignored(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """A script's background job inherits SIGINT ignored: a SIGINT as the eBPF probes load still
    ends the capture at once (it was lost there, and the capture ran its whole window)."""
    recipe = start_recipe(*PACED)
    out = tmp_path / "b"
    process = subprocess.Popen(
        attach_command(recipe.pid, duration=60, out=out, report=False),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if _holds_perf_events(process.pid):
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()  # its probes and tools go with it; the assertion says what happened
        process.communicate()
        raise AssertionError("the SIGINT was lost: the capture went on") from None
    assert process.returncode == 130, err
    _target_is_running(recipe.pid)
    assert leftovers(out) == []
    assert stale_uprobe_events() == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_signal_to_profkit_at_a_random_moment(
    start_recipe: StartRecipe, tmp_path: Path, sig: signal.Signals
) -> None:
    recipe = start_recipe(*PACED)
    out = tmp_path / "b"
    # A record of runs of this test's own: any profkit run cleans up after a killed one, and
    # one of another lane's tests could otherwise do it before this test's next run.
    runs = {"PROFKIT_RUN_DIR": str(tmp_path / "run")}
    process = _attach_background(recipe.pid, out, *ALL, env=runs)
    _wait_capturing(out, process)
    time.sleep(random.Random(sig.value).uniform(0.2, 3.0))
    process.send_signal(sig)
    process.wait(timeout=30)
    _target_is_running(recipe.pid)
    manifest = json.loads((out / "manifest.json").read_text())
    if sig == signal.SIGKILL:
        # Killed outright: the tools die with it, and the next run cleans up and says so.
        assert manifest["status"] == "capturing"
        time.sleep(0.5)
        later = run_profkit(
            *attach_args(recipe.pid, duration=0.3, out=tmp_path / "next", report=False),
            timeout=120,
            env=runs,
        )
        assert later.returncode == 0, later.stderr
        assert "was killed; cleaned up" in later.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "aborted"
    else:
        assert process.returncode == 130
        assert manifest["status"] == "partial"
    assert leftovers(out) == []
    assert stale_uprobe_events() == []
    assert recipe.process.poll() is None


@pytest.mark.parametrize("tool", ["pyspy", "perf_record", "perf_stat"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_signal_to_a_child_tool(
    start_recipe: StartRecipe, tmp_path: Path, tool: str, sig: signal.Signals
) -> None:
    recipe = start_recipe(*PACED)
    out = tmp_path / "b"
    process = subprocess.Popen(
        attach_command(recipe.pid, duration=2.5, out=out, report=False, extra=ALL),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_capturing(out, process)
    name = {"pyspy": "py-spy", "perf_record": "perf record", "perf_stat": "perf stat"}[tool]

    def victims() -> list[str]:
        return [line.split(":")[0] for line in leftovers(out) if name in line]

    # The tools start one after another, each at the speed a busy machine leaves it: the one
    # to signal is waited for (the capture's window opens only after all have started).
    deadline = time.monotonic() + 60
    while not victims() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    time.sleep(random.Random(f"{tool}{sig}").uniform(0.3, 1.5))
    found = victims()
    assert found, f"{name} should be running"
    os.kill(int(found[0]), sig)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    # A capture that ended early says why, and whether the target was still there.
    assert manifest["status"] == "complete", (
        manifest["status"],
        manifest.get("status_reason"),
        manifest.get("window"),
        f"target exit status {recipe.process.poll()}",
        err[-2000:],
    )
    for other in ("ebpf", "proc", "cgroup"):
        assert manifest["collectors"][other]["status"] == "ok", other
    _target_is_running(recipe.pid)
    assert leftovers(out) == []
    assert run_profkit("report", str(out)).returncode == 0


def test_target_killed_mid_capture(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe(*PACED)
    out = tmp_path / "b"
    process = _attach_background(recipe.pid, out)
    _wait_capturing(out, process)
    time.sleep(1.5)
    recipe.process.kill()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "target exited"
    assert leftovers(out) == []


def test_target_execs_mid_capture(tmp_path: Path) -> None:
    script = (
        "import os, time, torch\n"
        "torch.set_num_threads(4)\n"
        "x = torch.rand(1 << 20)\n"
        "print('ready', flush=True)\n"
        "end = time.time() + 4\n"
        "while time.time() < end: x.add_(1)\n"
        "os.execv('/bin/sleep', ['sleep', '20'])\n"
    )
    target = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().startswith("ready")
        out = tmp_path / "b"
        result = run_profkit(
            *attach_args(target.pid, duration=30, out=out, report=False),
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "target exec'd"
        assert leftovers(out) == []
    finally:
        target.kill()
        target.wait()


def test_reused_pid_is_refused_at_capture(start_recipe: StartRecipe, tmp_path: Path) -> None:
    import dataclasses

    from profkit.commands.attach import run_capture
    from profkit.errors import TargetChanged
    from profkit.host.target import inspect

    recipe = start_recipe("shm_fanout.py", "--threads", "2")
    stale = dataclasses.replace(inspect(recipe.pid), start_ticks=1)
    with pytest.raises(TargetChanged):
        run_capture(
            stale,
            duration=1.0,
            out=str(tmp_path / "b"),
            rate=10,
            collectors=None,
            max_size_mb=64.0,
            perf_callgraph="fp",
            perf_rate=49,
            no_report=True,
        )
    assert not (tmp_path / "b").exists()


def test_bundle_stays_under_max_size(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "8")
    out = tmp_path / "b"
    # A bound under what any capture of this target writes, however little CPU the other lanes
    # leave it, and over what cannot be dropped: five captures of 0.3 s of the fan-out recipe
    # (4 threads) wrote eBPF and native parts of 22-89 KB, and manifest, /proc and cgroup parts
    # (which stay) of 9.6-9.7 KB. At 0.1 MB a target slowed by the other lanes wrote less than
    # the bound, and nothing had to go.
    bound_mb = 0.02
    result = run_profkit(
        *attach_args(
            recipe.pid, duration=2, out=out, report=False, max_size=bound_mb, ebpf_sched="on"
        ),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    size = sum(p.stat().st_size for p in out.iterdir())
    assert size <= bound_mb * 1024 * 1024, size
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dropped_for_size"]
    assert run_profkit("report", str(out)).returncode == 0


def test_no_shell_sees_the_target_command_line(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); `touch {marker}`"
    target = subprocess.Popen([sys.executable, "-c", "import time, torch; time.sleep(30)", evil])
    try:
        time.sleep(2.0)
        result = run_profkit(
            *attach_args(target.pid, duration=1, out=tmp_path / "b", report=False),
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert not marker.exists()
        manifest = json.loads((tmp_path / "b/manifest.json").read_text())
        assert evil in manifest["target"]["cmdline"]
    finally:
        target.kill()
        target.wait()


def test_over_the_stop_budget_pyspy_goes_nonblocking(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    # 100 Hz --native on 8 threads holds the target stopped 10-30% of the time, far over 0.1%.
    # The monitor sees stops only at the /proc sampler's 5-Hz instants, from 1.5 s into the
    # window: at 50 Hz over 6 s (about 22 instants, 7% stopped at the least) it saw none in 1
    # run of 4; at 100 Hz over 10 s (about 42 instants, 14%) the chance of none is under 1%.
    recipe = start_recipe("shm_fanout.py", "--threads", "8")
    out = tmp_path / "b"
    result = run_profkit(
        *attach_args(
            recipe.pid,
            duration=10,
            out=out,
            report=False,
            collectors="proc,pyspy",
            rate=100,
            pyspy_mode="native",
            budget=0.1,
        ),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    decisions = manifest["budget_decisions"]
    assert decisions and decisions[0]["action"] == "nonblocking", decisions
    # Either rule of the stop budget may come first: the share of the time stopped, or, on a
    # loaded machine, one stop that lasts HANG_S or more (a fresh-clone run saw 1.2 s at once).
    reason = decisions[0]["reason"]
    hang = re.fullmatch(r"py-spy held the target stopped for ([\d.]+) s at once", reason)
    if hang is None:
        assert "stopped" in reason and "0.1% budget" in reason, reason
    else:
        assert float(hang.group(1)) >= round(HANG_S, 1), reason
    notes = manifest["collectors"]["pyspy"]["notes"]
    assert notes["native"] == [True, False]
    assert notes["rate_changes"][0]["native"] is False
    assert "T" not in states(recipe.pid) and "t" not in states(recipe.pid)
    assert run_profkit("report", str(out)).returncode == 0


def test_auto_mode_goes_nonblocking_when_one_hertz_is_over_budget(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "8")
    out = tmp_path / "b"
    result = run_profkit(
        *attach_args(
            recipe.pid, duration=2, out=out, report=False, collectors="proc,pyspy", budget=0.1
        ),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "py-spy goes --nonblocking" in result.stderr and "0.1% budget" in result.stderr
    notes = json.loads((out / "manifest.json").read_text())["collectors"]["pyspy"]["notes"]
    assert notes["native"] == [False] and "0.1% budget" in notes["mode_reason"]


def test_over_the_cpu_budget_a_collector_is_dropped(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "4")
    out = tmp_path / "b"
    result = run_profkit(
        # No --native stops, so that the stop budget cannot act first.
        *attach_args(
            recipe.pid,
            duration=7,
            out=out,
            report=False,
            collectors="proc,cgroup,pyspy",
            pyspy_mode="nonblocking",
            cpu_budget=0.0001,
        ),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    dropped = [d for d in manifest["budget_decisions"] if d["action"] == "drop"]
    assert dropped, manifest["budget_decisions"]
    assert "core budget" in dropped[0]["reason"]
    record = manifest["collectors"][dropped[0]["collector"]]
    assert record["status"] == "partial" and "core budget" in record["reason"]
    assert manifest["collectors"]["proc"]["status"] == "ok"  # the ground truth is never dropped
