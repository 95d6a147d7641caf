"""A hostile tester's cases: links planted for root to write through, numbers that are not
numbers, a second capture of one target, a profkit that crashes or is killed mid-capture."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from profkit.errors import (
    EXIT_BUSY,
    EXIT_CAPTURE,
    EXIT_OUTPUT,
    EXIT_PERMISSION,
    EXIT_USAGE,
)
from profkit.host import procfs
from recipes.launch import attach_args, attach_command

from ..support import NOBODY, ROOT, SYSTEM_PYTHON, error_line, one_line, profkit, profkit_in

# Every name a bundle may hold: the attacker plants a link for each.
BUNDLE_NAMES = (
    "manifest.json",
    "proc.json",
    "cgroup.json",
    "ebpf.json",
    "pyspy.json",
    "perf.json",
    "perf_stat.json",
    "perf.data",
    "perf_stat.csv",
    "pyspy.chrometrace.json",
    "perf_record.stdout",
    "perf_record.stderr",
    "pyspy.stdout",
    "pyspy.stderr",
    "perf_stat.stdout",
    "perf_stat.stderr",
)

# Run as nobody: wait for profkit's directory, then plant a link to a victim for every name.
# With swap, the directory profkit made is first renamed away and replaced by one of nobody's.
PLANTER = r"""
import os, sys, time
bundle, victims, swap = sys.argv[1], sys.argv[2], sys.argv[3] == "swap"
names = sys.argv[4:]
deadline = time.monotonic() + 60
wait_for = bundle if swap else os.path.join(bundle, "manifest.json")
while not os.path.lexists(wait_for):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.0005)
if swap:
    os.rename(bundle, bundle + ".moved")
    os.mkdir(bundle, 0o755)
for name in names:
    try:
        os.symlink(os.path.join(victims, name), os.path.join(bundle, name))
    except OSError:
        pass
print("planted", flush=True)
"""

# A test function, which apply() gives back with its marks.
Test = TypeVar("Test", bound=Callable[..., object])

needs_other_user = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
    pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason=f"needs {SYSTEM_PYTHON}"),
]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory nobody can enter (pytest's tmp_path is 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="profkit-hostile-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run_dir(tmp_path: Path) -> dict[str, str]:
    """A run directory of the test's own, so that its locks and records meet no one else's."""
    return {"PROFKIT_RUN_DIR": str(tmp_path / "run")}


@pytest.fixture
def python_sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([SYSTEM_PYTHON, "-c", "import time\nwhile True: time.sleep(0.05)"])
    time.sleep(0.3)
    yield process
    process.kill()
    process.wait()


def victims_in(directory: Path) -> dict[str, tuple[bytes, int]]:
    directory.mkdir(mode=0o755)
    for name in BUNDLE_NAMES:
        (directory / name).write_bytes(b"victim " + name.encode())
        (directory / name).chmod(0o644)
    return snapshot(directory)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.name: (p.read_bytes(), p.stat().st_mode & 0o7777) for p in sorted(directory.iterdir())
    }


def start_planter(bundle: Path, victims: Path, swap: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            SYSTEM_PYTHON,
            "-c",
            PLANTER,
            str(bundle),
            str(victims),
            "swap" if swap else "wait",
            *BUNDLE_NAMES,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def apply(marks: list[pytest.MarkDecorator]) -> Callable[[Test], Test]:
    """Several marks kept in one list, applied to a test."""

    def decorate(function: Test) -> Test:
        for mark in marks:
            function = mark(function)
        return function

    return decorate


@apply(needs_other_user)
def test_out_owned_by_another_user_is_refused_and_no_victim_changes(
    shared_dir: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    victims = shared_dir / "victims"
    before = victims_in(victims)
    out = shared_dir / "theirs"
    out.mkdir()
    os.chown(out, NOBODY, NOBODY)
    out.chmod(0o755)
    planter = start_planter(out, victims, swap=False)
    try:
        result = profkit(
            *attach_args(
                python_sleeper.pid, duration=1, collectors="proc,cgroup", out=out, report=False
            ),
            env=run_dir,
        )
    finally:
        planter.kill()
        planter.wait()
    assert result.returncode == EXIT_OUTPUT, result.stderr
    assert f"owned by uid {NOBODY}" in one_line(result)
    assert snapshot(victims) == before
    assert list(out.iterdir()) == []
    assert oct(out.stat().st_mode & 0o777) == "0o755", "never chmod a directory not created"


@apply(needs_other_user)
def test_links_planted_in_a_swapped_directory_are_never_written_through(
    shared_dir: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    """Nobody owns the parent: it renames profkit's new bundle away and puts a directory of
    its own, full of links to the victims, in its place while profkit captures."""
    victims = shared_dir / "victims"
    before = victims_in(victims)
    parent = shared_dir / "parent"
    parent.mkdir()
    os.chown(parent, NOBODY, NOBODY)
    bundle = parent / "bundle"
    planter = start_planter(bundle, victims, swap=True)
    try:
        result = profkit(
            *attach_args(
                python_sleeper.pid,
                duration=1,
                collectors="proc,cgroup,perf_record,pyspy",
                rate=5,
                out=bundle,
                report=False,
            ),
            env=run_dir,
        )
        planted, _ = planter.communicate(timeout=10)
    finally:
        planter.kill()
        planter.wait()
    assert planted.strip() == "planted", "the planter never saw the bundle"
    assert snapshot(victims) == before
    assert bundle.stat().st_uid == NOBODY and all(p.is_symlink() for p in bundle.iterdir())
    if result.returncode == 0:
        # The swap came after profkit held its directory open: everything went there.
        manifest = json.loads((parent / "bundle.moved" / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert manifest["collectors"]["proc"]["status"] == "ok"
    else:
        # The swap came before profkit held its directory: between mkdir and open (the one it
        # opened is not profkit's), or between the open and the check that the name still
        # leads to what it opened. Refused either way (after the note that the target has no
        # torch).
        assert result.returncode == EXIT_OUTPUT, result.stderr
        line = error_line(result)
        assert f"owned by uid {NOBODY}" in line or f"{bundle} was replaced while" in line, line


@pytest.mark.root
@pytest.mark.parametrize("link_to", ["nothing", "an empty directory"])
def test_out_that_is_a_link_is_refused(
    link_to: str, tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    pointed = tmp_path / "pointed"
    if link_to != "nothing":
        pointed.mkdir(mode=0o755)
        pointed.chmod(0o755)
    out = tmp_path / "out"
    out.symlink_to(pointed)
    result = profkit(*attach_args(python_sleeper.pid, duration=1, out=out), env=run_dir)
    assert result.returncode == EXIT_OUTPUT, result.stderr
    assert "is a symbolic link" in one_line(result)
    assert out.is_symlink()
    if link_to != "nothing":
        assert list(pointed.iterdir()) == []
        assert oct(pointed.stat().st_mode & 0o777) == "0o755"
    else:
        assert not pointed.exists()


@pytest.mark.root
def test_out_that_others_may_write_to_is_refused(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    out = tmp_path / "open"
    out.mkdir()
    out.chmod(0o1777)
    result = profkit(*attach_args(python_sleeper.pid, duration=1, out=out), env=run_dir)
    assert result.returncode == EXIT_OUTPUT, result.stderr
    assert "can be written by other users" in one_line(result)
    assert oct(out.stat().st_mode & 0o7777) == "0o1777"
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["--duration", "nan"],
        ["--duration", "inf"],
        ["--duration", "1e999"],
        ["--perf-rate", "0"],
        ["--rate", "nan"],
        ["--budget", "inf"],
        ["--collectors", ""],
    ],
    ids=lambda a: " ".join(a) or "empty",
)
def test_bad_numbers_exit_2_at_once_and_start_nothing(
    args: list[str], tmp_path: Path, python_sleeper: subprocess.Popen[bytes]
) -> None:
    out = tmp_path / "bundle"
    env = {**os.environ, "PROFKIT_RUN_DIR": str(tmp_path / "run")}
    process = subprocess.Popen(
        attach_command(python_sleeper.pid, extra=[*args, "--out", str(out)]),
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    children: set[str] = set()
    while process.poll() is None:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{process.pid}/task").iterdir():
                children |= set((task / "children").read_text().split())
        time.sleep(0.002)
    _, stderr = process.communicate()
    result = subprocess.CompletedProcess(process.args, process.returncode, "", stderr)
    assert result.returncode == EXIT_USAGE, stderr
    # Click's own message: the value was refused while the arguments were parsed, before
    # profkit looked at the target (how long that takes is the machine's, not a guarantee).
    assert "Invalid value" in one_line(result)
    assert children == set(), "a tool was started"
    assert not out.exists() and not (tmp_path / "run").exists()
    assert procfs.read_stat(python_sleeper.pid).state != "T"


# A fault no one anticipated, raised inside the capture window of a real capture: the third
# look at the target raises, as a bug in any code the window runs would.
INJECT_FAULT = """
import sys
from profkit.capture import session as capture
calls = []
real = capture.target_state
def failing(target):
    calls.append(1)
    if len(calls) == 3:
        raise RuntimeError("injected fault")
    return real(target)
capture.target_state = failing
from profkit.cli import main
main(sys.argv[1:])
"""


def tools_writing_into(profkit_pid: int) -> list[str]:
    """Processes whose command line names a file in that profkit's held bundle directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if f"/proc/{profkit_pid}/fd/" in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.root
def test_an_unexpected_exception_marks_the_bundle_aborted_at_once(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    out = tmp_path / "bundle"
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            INJECT_FAULT,
            *attach_args(
                python_sleeper.pid,
                duration=20,
                collectors="proc,perf_record",
                out=out,
                report=False,
            ),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **run_dir},
    )
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith("profkit: error: unexpected RuntimeError")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "aborted"
    assert manifest["status_reason"] == "internal error: RuntimeError: injected fault"
    # perf was stopped by profkit: its result stands, "ok" with samples of the mostly sleeping
    # target, "partial" for want of any.
    perf = manifest["collectors"]["perf_record"]
    assert (perf["status"], perf["reason"]) == (
        ("ok", "") if perf["samples"] else ("partial", "no samples")
    ), perf
    assert not (out / "perf.data").exists()
    assert tools_writing_into(process.pid) == []
    assert list(Path(run_dir["PROFKIT_RUN_DIR"]).glob("*.json")) == []
    assert list(Path(run_dir["PROFKIT_RUN_DIR"]).glob("target-*.lock")) == [], "lock released"
    assert procfs.read_stat(python_sleeper.pid).state != "T"


@pytest.mark.root
def test_a_killed_profkits_bundle_is_marked_aborted_by_the_next_run(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    out = tmp_path / "killed"
    process = subprocess.Popen(
        attach_command(
            python_sleeper.pid, duration=30, collectors="proc,perf_record", out=out, report=False
        ),
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, **run_dir},
    )
    deadline = time.monotonic() + 30
    while not (out / "perf.data").exists() or not (out / "manifest.json").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    time.sleep(0.5)  # the tools get SIGTERM from the kernel as their parent dies
    assert json.loads((out / "manifest.json").read_text())["status"] == "capturing"
    later = profkit(
        *attach_args(
            python_sleeper.pid, duration=1, collectors="proc", out=tmp_path / "later", report=False
        ),
        env=run_dir,
    )
    assert later.returncode == 0, later.stderr
    assert f"marked {out} aborted" in later.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "aborted"
    assert manifest["status_reason"] == "profkit was killed during the capture"
    assert not (out / "perf.data").exists()


@pytest.mark.root
def test_a_disk_that_fills_mid_capture_aborts_it(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        out = mount / "bundle"
        process = subprocess.Popen(
            attach_command(
                python_sleeper.pid,
                duration=3,
                collectors="proc,cgroup,perf_record",
                out=out,
                report=False,
            ),
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, **run_dir},
        )
        deadline = time.monotonic() + 30
        while not (out / "perf.data").exists():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as filler:
            while True:
                filler.write(b"\0" * 65536)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == EXIT_OUTPUT, stderr
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("profkit: error: cannot write") and "No space left" in last
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "aborted"
        assert "No space left" in manifest["status_reason"]
        assert not (out / "perf.data").exists()
        assert tools_writing_into(process.pid) == []
        assert procfs.read_stat(python_sleeper.pid).state != "T"
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.root
def test_a_second_capture_of_one_target_is_refused_or_forced_and_recorded(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    first = tmp_path / "first"
    pid = str(python_sleeper.pid)
    process = subprocess.Popen(
        attach_command(pid, duration=6, collectors="proc", out=first, report=False),
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **run_dir},
    )
    deadline = time.monotonic() + 30
    while not (first / "manifest.json").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    second = profkit(
        *attach_args(pid, duration=1, collectors="proc", out=tmp_path / "second"),
        env=run_dir,
    )
    assert second.returncode == EXIT_BUSY, second.stderr
    line = [x for x in second.stderr.splitlines() if x.startswith("profkit: error:")]
    assert len(line) == 1 and f"profkit pid {process.pid} into {first}" in line[0], line
    assert "--force" in line[0]
    assert not (tmp_path / "second").exists()
    forced = profkit(
        *attach_args(
            pid, duration=1, collectors="proc", out=tmp_path / "forced", force=True, report=False
        ),
        env=run_dir,
    )
    assert forced.returncode == 0, forced.stderr
    assert process.poll() is None, "the first capture was still running"
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    forced_manifest = json.loads((tmp_path / "forced" / "manifest.json").read_text())
    first_manifest = json.loads((first / "manifest.json").read_text())
    assert forced_manifest["overlapped_with"] == [{"pid": process.pid, "bundle": str(first)}]
    assert [o["bundle"] for o in first_manifest["overlapped_with"]] == [str(tmp_path / "forced")]
    assert f"captured pid {pid} at the same time" in stderr
    assert list(Path(run_dir["PROFKIT_RUN_DIR"]).iterdir()) == [], "locks and notices removed"


@pytest.mark.root
def test_perf_killed_by_someone_else_says_so(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    out = tmp_path / "bundle"
    process = subprocess.Popen(
        attach_command(
            python_sleeper.pid, duration=4, collectors="proc,perf_record", out=out, report=False
        ),
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **run_dir},
    )
    deadline = time.monotonic() + 30
    # Killed once it has made perf.data: what it wrote is read, and the result is partial (a
    # perf killed before that has nothing to read, and fails).
    while (
        not (perf := [t for t in tools_writing_into(process.pid) if " record " in t])
        or not (out / "perf.data").exists()
    ):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    os.kill(int(perf[0].split(":")[0]), signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    result = json.loads((out / "manifest.json").read_text())["collectors"]["perf_record"]
    assert result["status"] == "partial", result
    assert result["reason"] == "perf was killed by SIGKILL, not by profkit", result


@pytest.mark.root
def test_a_target_that_exits_reads_as_such(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    out = tmp_path / "bundle"
    process = subprocess.Popen(
        attach_command(python_sleeper.pid, duration=20, collectors="proc", out=out, report=False),
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **run_dir},
    )
    deadline = time.monotonic() + 30
    while not (out / "manifest.json").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    time.sleep(1.0)
    python_sleeper.kill()
    process.communicate(timeout=60)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "target exited"
    assert manifest["status_reason"] == "the target exited during the capture"


# The target exits as the eBPF collector starts (its probes load): every reader of its files
# then fails, and the one line must say the target exited, not which file was missing.
EXIT_AS_PROBES_LOAD = """
import os, signal, sys, time
from profkit.capture.ebpf import collector
real = collector.EbpfCollector.start
def start(self, context):
    os.kill(context.target.pid, signal.SIGKILL)
    while os.path.exists(f"/proc/{context.target.pid}/maps"):
        time.sleep(0.01)
    return real(self, context)
collector.EbpfCollector.start = start
from profkit.cli import main
main(sys.argv[1:])
"""


@pytest.mark.root
def test_a_target_that_exits_as_the_probes_load_reads_as_exited(
    tmp_path: Path, run_dir: dict[str, str]
) -> None:
    # Not a child of this test: killed, it is reaped by init, not left a zombie here.
    sleeper = "import os, time\nprint(os.getpid(), flush=True)\nwhile True: time.sleep(0.05)"
    with subprocess.Popen(
        ["setsid", "--fork", SYSTEM_PYTHON, "-c", sleeper], stdout=subprocess.PIPE, text=True
    ) as starter:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
    out = tmp_path / "bundle"
    process = subprocess.run(
        [
            sys.executable,
            "-c",
            EXIT_AS_PROBES_LOAD,
            *attach_args(pid, duration=5, collectors="ebpf", out=out, report=False),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **run_dir},
        timeout=120,
    )
    assert process.returncode == 3, process.stderr
    (line,) = process.stderr.strip().splitlines()[-1:]
    assert line == f"profkit: error: pid {pid}: target exited while the collectors started", line
    assert json.loads((out / "manifest.json").read_text())["status"] == "aborted"


@apply(needs_other_user)
def test_a_user_profiling_their_own_process_runs_what_they_may(shared_dir: Path) -> None:
    home = shared_dir / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    target = subprocess.Popen(
        [*as_nobody, SYSTEM_PYTHON, "-c", "import time\nwhile True: time.sleep(0.05)"]
    )
    try:
        time.sleep(0.5)
        pid = str(target.pid)
        paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
        result = profkit_in(home, *attach_args(pid, duration=1, out="b", report=False), user=NOBODY)
        assert result.returncode == 0, result.stderr
        notes = result.stderr.strip().splitlines()
        assert all(line.startswith("profkit: note: ") for line in notes), result.stderr
        assert "profkit: note: ebpf not started: loading eBPF programs needs root" in notes[0]
        manifest = json.loads((home / "b" / "manifest.json").read_text())
        collectors = manifest["collectors"]
        assert manifest["status"] == "complete"
        assert collectors["ebpf"]["status"] == "unavailable"
        assert collectors["proc"]["status"] == "ok"
        if paranoid > 0:
            assert collectors["perf_record"]["status"] == "unavailable"
            assert f"perf_event_paranoid is {paranoid}" in collectors["perf_record"]["reason"]
            assert any("perf_record not started" in line for line in notes)
        only_ebpf = profkit_in(
            home, *attach_args(pid, duration=1, collectors="ebpf", out="c"), user=NOBODY
        )
        assert only_ebpf.returncode == EXIT_PERMISSION, only_ebpf.stderr
        assert "none of the collectors asked for can run" in one_line(only_ebpf)
        assert not (home / "c").exists()
    finally:
        target.kill()
        target.wait()


@pytest.mark.parametrize("status", ["capturing", "complete"])
def test_cleanup_after_a_dead_capture_touches_only_an_unfinished_bundle(
    status: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from profkit.capture import runs

    monkeypatch.setattr(runs, "RUN_DIR", tmp_path / "run")
    bundle = tmp_path / "bundle"
    bundle.mkdir(mode=0o700)
    (bundle / "manifest.json").write_text(json.dumps({"status": status, "status_reason": ""}))
    (bundle / "perf.data").write_bytes(b"samples of every process")
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert runs.run_dir_usable()
    info = bundle.stat()
    record = {
        "owner": dead.pid,
        "owner_start": -1,
        "target": 0,
        "target_start": None,
        "bundle": str(bundle),
        "bundle_inode": [info.st_dev, info.st_ino],
        "children": [],
    }
    (tmp_path / "run" / f"{dead.pid}.json").write_text(json.dumps(record))
    [cleanup] = runs.clean_stale()
    manifest = json.loads((bundle / "manifest.json").read_text())
    if status == "capturing":
        assert manifest["status"] == "aborted"
        assert not (bundle / "perf.data").exists()
        assert f"marked {bundle} aborted" in cleanup.actions
    else:
        assert manifest["status"] == "complete"
        assert (bundle / "perf.data").exists(), "a finished bundle keeps what it kept"
        assert cleanup.actions == ()
    assert not (tmp_path / "run" / f"{dead.pid}.json").exists()


@apply(needs_other_user)
def test_a_perf_the_kernel_refuses_reads_as_permission_denied(shared_dir: Path) -> None:
    from profkit.capture.collectors.perfrecord import failure_reason
    from profkit.host.tools import find_tool

    perf = find_tool("perf").path
    paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    if perf is None or paranoid <= 0:
        pytest.skip("needs perf, and perf_event_paranoid > 0 so that users may not sample CPUs")
    shared_dir.chmod(0o777)
    refused = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            perf,
            "record",
            "-e",
            "cpu-clock",
            "-a",
            "-o",
            str(shared_dir / "p.data"),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0, refused.stderr
    why = failure_reason(refused.returncode, [], refused.stderr)
    assert why == f"permission denied (kernel.perf_event_paranoid is {paranoid})", refused.stderr


@pytest.mark.root
def test_no_collector_able_to_start_leaves_an_aborted_bundle(
    tmp_path: Path, python_sleeper: subprocess.Popen[bytes], run_dir: dict[str, str]
) -> None:
    out = tmp_path / "bundle"
    result = profkit(
        *attach_args(python_sleeper.pid, duration=1, collectors="perf_record", out=out),
        env={**run_dir, "PROFKIT_PERF": str(tmp_path / "no-such-perf")},
    )
    assert result.returncode == EXIT_CAPTURE, result.stderr
    assert "no collector could start" in result.stderr.strip().splitlines()[-1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "aborted"
    assert manifest["status_reason"].startswith("no collector could start: ")
    assert manifest["collectors"]["perf_record"]["status"] == "unavailable"
