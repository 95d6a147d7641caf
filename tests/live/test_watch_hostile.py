"""`watch` as root against what other users' processes and a push server may hold: a command
line that names no script (`-W ..`) or carries a secret in a rewritten argv[0], links planted in
the profile directory, a server that answers garbage or trickles, short-lived targets."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profkit.errors import EXIT_OUTPUT

from ..support import NOBODY, SYSTEM_PYTHON
from ..unit.test_watch_hostile import (
    ScriptedServer,
    garbage,
    many_headers,
    ok,
    tree,
    trickle,
    wait_for,
)
from ..watch_support import agent
from .test_hostile import apply, needs_other_user, shared_dir, snapshot  # noqa: F401

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash (exec -a)"),
]

SECRET = "--api-key=SECRET"
# Long enough that the first of four 1.5-s targets is still listed when the last has run.
EXPIRE_S = 20.0
# About a tenth of a core: enough CPU for a profile every window.
BUSY = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.monotonic()
    while time.monotonic() - t < 0.01:
        pass
    time.sleep(0.09)
"""


def start_busy(
    script: Path,
    seconds: float,
    *,
    python_args: tuple[str, ...] = (),
    argv0: str | None = None,
    user: int | None = None,
) -> subprocess.Popen[bytes]:
    """script (BUSY) for `seconds`, as `user`, with argv[0] rewritten as `exec -a` does."""
    script.write_text(BUSY)
    script.chmod(0o644)
    command = [SYSTEM_PYTHON, *python_args, str(script), str(seconds)]
    if argv0 is not None:
        command = ["bash", "-c", 'exec -a "$0" "$@"', argv0, *command]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def processes(*started: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        time.sleep(0.3)
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()


def victim_dir(path: Path) -> dict[str, tuple[bytes, int]]:
    """nobody's 0700 directory of profiles."""
    path.mkdir(mode=0o700)
    for name in ("1-2.pb.gz", "3-4.pb.gz", "notes.txt"):
        (path / name).write_bytes(b"victim " + name.encode())
        os.chown(path / name, NOBODY, NOBODY)
    os.chown(path, NOBODY, NOBODY)
    path.chmod(0o700)
    return snapshot(path)


def targets_in(metrics: str) -> set[str]:
    return set(
        re.findall(r'^profkit_process_cpu_seconds_total\{[^}]*target="([^"]*)"', metrics, re.M)
    )


def counter(metrics: str, name: str) -> float:
    found = re.search(rf"^{name} ([\d.e+]+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


@apply(needs_other_user)
def test_profiles_never_written_through_links_or_out_of_dir(shared_dir: Path) -> None:  # noqa: F811
    """Targets run by nobody: one as `python -W .. dotdot.py` (the old label `..` put its
    profiles in DIR/.. and pruned there), one with argv[0] rewritten to carry a secret, one whose
    directory name is a link (planted while DIR was writable) into nobody's 0700 directory."""
    victims = shared_dir / "victims"
    victims_before = victim_dir(victims)
    parent = shared_dir / "parent"
    parent.mkdir()
    (parent / "1-2.pb.gz").write_bytes(b"victim in the parent")
    os.chown(parent / "1-2.pb.gz", NOBODY, NOBODY)
    parent_before = tree(parent)
    profiles = parent / "profiles"
    profiles.mkdir(mode=0o700)
    (profiles / "linked").symlink_to(victims)
    scripts = shared_dir / "scripts"
    scripts.mkdir(mode=0o755)
    marker = re.escape(str(scripts))
    old_umask = os.umask(0)  # the agent's modes must not come from its umask
    try:
        run = [
            start_busy(scripts / "dotdot.py", 60, python_args=("-W", ".."), user=NOBODY),
            start_busy(scripts / "spender.py", 60, argv0=f"worker {SECRET}", user=NOBODY),
            start_busy(scripts / "linked.py", 60, user=NOBODY),
        ]
        with (
            processes(*run),
            agent(
                "--match",
                marker,
                "--interval",
                "0.5",
                "--no-probes",
                "--profiles",
                str(profiles),
                "--keep",
                "1",
            ) as a,
        ):
            os.umask(old_umask)
            a.wait_serving()
            assert wait_for(
                lambda: counter(a.metrics(), "profkit_profiles_written_total") >= 8, 60
            ), a.output
            metrics = a.metrics()
            code, _ = a.terminate()
    finally:
        os.umask(old_umask)
    assert code == 0, a.output
    assert snapshot(victims) == victims_before
    assert {k: v for k, v in tree(parent).items() if not k.startswith("profiles")} == parent_before
    assert targets_in(metrics) == {"dotdot", "spender", "linked"}, metrics
    assert "SECRET" not in metrics and "SECRET" not in a.output
    assert (profiles / "linked").is_symlink()
    assert stat.S_IMODE(profiles.stat().st_mode) == 0o700
    for name in ("dotdot", "spender"):
        directory = profiles / name
        assert stat.S_IMODE(directory.lstat().st_mode) == 0o700
        files = list(directory.iterdir())
        assert len(files) == 1 and files[0].name.endswith(".pb.gz"), files  # --keep 1
        assert stat.S_IMODE(files[0].lstat().st_mode) == 0o600
    assert sorted(p.name for p in profiles.iterdir()) == ["dotdot", "linked", "spender"]
    said = [line for line in a.output.splitlines() if "cannot write profiles" in line]
    assert len(said) == 1 and "Traceback" not in a.output, a.output


@apply(needs_other_user)
def test_profiles_dir_another_user_could_plant_in_is_refused(shared_dir: Path) -> None:  # noqa: F811
    victims = shared_dir / "victims"
    before = victim_dir(victims)
    theirs = shared_dir / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "busy").symlink_to(victims)
    with agent("--match", "no-such-command-[0-9]{12}", "--profiles", str(theirs)) as a:
        code = a.process.wait(timeout=30)
        wait_for(lambda: "error" in a.output, 5)
    assert code == EXIT_OUTPUT, a.output
    lines = a.output.strip().splitlines()
    assert len(lines) == 1 and f"owned by uid {NOBODY}" in lines[0], a.output
    assert snapshot(victims) == before
    assert [p.name for p in theirs.iterdir()] == ["busy"]


def test_push_thread_survives_garbage_headers_and_trickle(tmp_path: Path) -> None:
    answers = [garbage, many_headers, trickle(every=4.0, bound=40), ok]
    with (
        ScriptedServer(answers, timeout=120) as server,
        processes(start_busy(tmp_path / "pushed.py", 120)),
        agent(
            "--match",
            re.escape(str(tmp_path / "pushed.py")),
            "--interval",
            "0.5",
            "--no-probes",
            "--push",
            server.url,
        ) as a,
    ):
        a.wait_serving()
        assert wait_for(lambda: counter(a.metrics(), "profkit_profile_pushes_total") >= 3, 60), (
            a.output + a.metrics()
        )
        metrics = a.metrics()
        assert counter(metrics, "profkit_profile_push_failures_total") == 3, metrics
        code, _ = a.terminate()
    assert code == 0, a.output
    # The trickling server was cut at the 5-s deadline, not when it ran out of bytes (40 s).
    assert 4.5 < server.durations[2] < 7.0, server.durations
    said = [line for line in a.output.splitlines() if "cannot push profiles" in line]
    assert len(said) == 1 and "Traceback" not in a.output, a.output


def test_series_of_short_lived_targets_expire(tmp_path: Path) -> None:
    names = [f"brief{i}" for i in range(4)]
    args = ("--match", re.escape(str(tmp_path)), "--interval", "0.5", "--no-probes")
    with agent(*args, "--expire", str(EXPIRE_S)) as a:
        a.wait_serving()
        for name in names:
            start_busy(tmp_path / f"{name}.py", 1.5).wait(timeout=30)
        seen = targets_in(a.metrics())
        assert seen == set(names), a.output + a.metrics()
        gone_at = time.monotonic()
        assert wait_for(lambda: not targets_in(a.metrics()), EXPIRE_S + 15), a.metrics()
        took = time.monotonic() - gone_at
        metrics = a.metrics()
        code, _ = a.terminate()
    assert code == 0, a.output
    # Not before its time: the last target was gone for at most a window when it was seen.
    assert took >= EXPIRE_S - 1, took
    assert "profkit_targets 0.0" in metrics
    assert not re.search(r'target="brief', metrics), metrics
