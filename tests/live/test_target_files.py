"""Files a target names are read inside its root, as the target could, to a bound: a hostile
target (run as nobody) names a root-only file, a FIFO, /dev/zero, or links out of its root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profkit.host.targetfs import SourceLines, TargetFileError, read_target_file
from profkit.watch.labels import kubernetes
from recipes.launch import attach_command

from ..support import NOBODY, ROOT, SYSTEM_PYTHON, profkit
from ..watch_support import agent

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
SECRET = "SECRET_TOKEN_9f3a"
PUBLIC = "PUBLIC_TOKEN_51c7"
# Line 2 is the line each hot function's copy runs on: what a report quotes as its code.
# The comment's call is what a site's op is read from (the last call on the line): a line read
# would reach the metrics as op="aten::<token>".
SOURCE = "def hot(d, s):\n    d.copy_(s)  # .{token}()\n"

# Two hot functions dispatching OpenMP regions, whose code objects name the files given.
TARGET = f"""
SOURCE = {SOURCE.format(token="x")!r}
import sys, time, torch
torch.set_num_threads(2)
src = torch.ones(1 << 18)
dst = torch.empty_like(src)
hot = []
for name in sys.argv[1:]:
    space = {{}}
    exec(compile(SOURCE, name, "exec"), space)
    hot.append(space["hot"])
print("ready", flush=True)
while True:
    for h in hot:
        h(dst, src)
    time.sleep(0.002)
"""


@pytest.fixture
def places() -> Iterator[dict[str, Path]]:
    """A root-only directory holding a secret, and one nobody may use holding public files
    (pytest's tmp_path lies under a directory only root may enter)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="profkit-target-files-"))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "secret.py"
    secret.write_text(SOURCE.format(token=SECRET))
    secret.chmod(0o600)
    public = tmp_path / "public"
    public.mkdir()
    tmp_path.chmod(0o755)
    public.chmod(0o777)
    (public / "open.py").write_text(SOURCE.format(token=PUBLIC))
    (public / "open.py").chmod(0o644)
    os.mkfifo(public / "fifo.py")
    os.symlink(secret, public / "link.py")
    try:
        yield {"secret": secret, "public": public / "open.py", "dir": public}
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def nobody_process(*argv: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([*AS_NOBODY, *argv], stdout=subprocess.PIPE, text=True, cwd=cwd or ROOT)


def stop(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait(timeout=20)


def test_a_file_is_read_only_as_the_target_could_and_only_if_regular(
    places: dict[str, Path],
) -> None:
    sleeper = nobody_process(
        sys.executable,
        "-c",
        "print('ready', flush=True)\nimport time\ntime.sleep(60)",
        cwd=places["dir"],
    )
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"
        pid = sleeper.pid
        assert PUBLIC.encode() in read_target_file(pid, str(places["public"]))
        assert PUBLIC.encode() in read_target_file(pid, "open.py")  # from its working directory
        started = time.monotonic()
        for name, why in (
            (str(places["secret"]), "Permission denied"),  # root could; nobody cannot
            (str(places["dir"] / "link.py"), "symbolic links"),  # a link as the last name
            (str(places["dir"] / "fifo.py"), "not a regular file"),  # would block a reader
            ("/dev/zero", "not a regular file"),  # would never end
            ("../private/secret.py", "No such file"),  # '..' stops at the working directory
        ):
            with pytest.raises(TargetFileError, match=why):
                read_target_file(pid, name)
        assert time.monotonic() - started < 5
        with pytest.raises(TargetFileError, match="larger than"):
            read_target_file(pid, str(places["public"]), limit=10)
        lines = SourceLines(pid)
        assert lines.line(str(places["public"]), 2) is not None
        assert lines.line(str(places["secret"]), 2) is None
        assert lines.line(str(places["dir"] / "fifo.py"), 2) is None
    finally:
        stop(sleeper)


def test_the_namespace_label_is_read_inside_the_targets_root(tmp_path: Path) -> None:
    """An absolute link in the target's root resolves there, not in the agent's."""
    outside = Path(f"/srv/profkit-ns-{os.getpid()}")
    root = tmp_path / "root"
    secrets = "secrets/kubernetes.io/serviceaccount"
    try:
        (outside / secrets).mkdir(parents=True)
        (outside / secrets / "namespace").write_text("host-only\n")
        (root / outside.relative_to("/") / secrets).mkdir(parents=True)
        (root / outside.relative_to("/") / secrets / "namespace").write_text("in-the-pod\n")
        (root / "var").mkdir()
        (root / "var" / "run").symlink_to(outside)  # absolute, as /var/run -> /run usually is
        for d in [tmp_path, *root.rglob("*")]:
            if d.is_dir() and not d.is_symlink():
                d.chmod(0o755)
        child = os.fork()
        if child == 0:  # the target: chrooted into root, then nobody, then waiting
            try:
                os.chroot(root)
                os.chdir("/")
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                time.sleep(60)
            finally:
                os._exit(0)
        try:
            time.sleep(0.3)
            pod = "kubepods/podaaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee/" + "e" * 64
            assert kubernetes(child, f"0::/{pod}\n")["namespace"] == "in-the-pod"
            # A FIFO there gives no label, and no hang.
            (root / outside.relative_to("/") / secrets / "namespace").unlink()
            os.mkfifo(root / outside.relative_to("/") / secrets / "namespace")
            started = time.monotonic()
            assert kubernetes(child, f"0::/{pod}\n")["namespace"] == ""
            assert time.monotonic() - started < 5
        finally:
            os.kill(child, 9)
            os.waitpid(child, 0)
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def attach(pid: int, bundle: Path, **flags: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        attach_command(pid, out=bundle, **flags),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def captured_text(bundle: Path, report: str) -> str:
    """Everything a capture published: its printed report, every bundle file, the HTML."""
    html = bundle.parent / "report.html"
    profkit("report", str(bundle), "--format", "html", "-o", str(html))
    parts = [report, html.read_text(errors="replace")]
    parts += [p.read_text(errors="replace") for p in bundle.iterdir() if p.is_file()]
    return "\n".join(parts)


def test_a_root_only_file_a_hot_function_names_appears_nowhere(
    tmp_path: Path, places: dict[str, Path]
) -> None:
    target = nobody_process(
        sys.executable, "-c", TARGET, str(places["public"]), str(places["secret"])
    )
    try:
        assert target.stdout is not None and target.stdout.readline() == "ready\n"
        bundle = tmp_path / "bundle"
        result = attach(target.pid, bundle, duration=3)
        assert result.returncode == 0, result.stderr
        ebpf = json.loads((bundle / "ebpf.json").read_text())
        assert ebpf["python"]["walker"] == "on", ebpf["python"]
        text = captured_text(bundle, result.stdout + result.stderr)
        # The public file's line is read (the path works), the root-only one's is not.
        assert PUBLIC in text
        assert SECRET not in text
        assert str(places["secret"]) in text  # the frame is kept, named, without its code
    finally:
        stop(target)


def test_a_root_only_file_a_hot_function_names_stays_out_of_the_metrics(
    places: dict[str, Path],
) -> None:
    target = nobody_process(
        sys.executable, "-c", TARGET, str(places["public"]), str(places["secret"])
    )
    try:
        assert target.stdout is not None and target.stdout.readline() == "ready\n"
        with agent("--pid", str(target.pid), "--interval", "1") as a:
            a.wait_serving()
            deadline = time.monotonic() + 60
            metrics = ""
            # Both hot functions' sites once the walker has read them: the public one's line
            # is quoted, so the secret one's would be too if profkit read it.
            while time.monotonic() < deadline and not (
                str(places["secret"]) in metrics and PUBLIC in metrics
            ):
                time.sleep(0.5)
                metrics = a.metrics()
            assert str(places["secret"]) in metrics and PUBLIC in metrics, a.output + metrics
            assert SECRET not in metrics and SECRET not in a.output
            code, took = a.terminate()
        assert code == 0 and took < 5
    finally:
        stop(target)


@pytest.mark.parametrize("name", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_the_file_name_costs_nothing(
    tmp_path: Path, places: dict[str, Path], name: str
) -> None:
    filename = str(places["dir"] / "fifo.py") if name == "fifo" else name
    target = nobody_process(sys.executable, "-c", TARGET, filename)
    try:
        assert target.stdout is not None and target.stdout.readline() == "ready\n"
        bundle = tmp_path / "bundle"
        started = time.monotonic()
        result = attach(target.pid, bundle, duration=2)
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        # The same capture of a target whose files are ordinary takes 10-15 s here: a blocked
        # read would never return, /dev/zero would take memory until killed.
        assert took < 60, took
        assert target.poll() is None
    finally:
        stop(target)


EXECS = """
import os, sys, time
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
os.execv(sys.executable, [sys.executable, "-c", "import time\\ntime.sleep(60)"])
"""


def test_an_exec_during_a_capture_is_not_called_complete(tmp_path: Path) -> None:
    target = subprocess.Popen([sys.executable, "-c", EXECS, "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline() == "ready\n"
        bundle = tmp_path / "bundle"
        result = attach(target.pid, bundle, duration=30, collectors="proc", report=False)
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert manifest["status"] == "target exec'd", (manifest, result.stderr)
    finally:
        stop(target)


def test_a_zombie_reads_as_exited_not_as_an_exec() -> None:
    """A killed target not yet reaped keeps its /proc entry but loses its executable link."""
    from profkit.host import procfs

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        image = procfs.read_image(child.pid)
        assert image.exe != (0, 0)
        child.kill()
        deadline = time.monotonic() + 10
        while procfs.read_stat(child.pid).state != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(ProcessLookupError):
            procfs.read_image(child.pid)
    finally:
        child.kill()
        child.wait()


OWN_FILE = """
import os, sys
from profkit.host.targetfs import SourceLines, TargetFileError, read_target_file
lines = SourceLines(os.getpid())
print(lines.line(sys.argv[1], 2))
try:
    read_target_file(os.getpid(), sys.argv[2])
except TargetFileError as exc:
    print("refused:", exc)
"""


def test_a_user_other_than_root_reads_its_own_files_as_itself(places: dict[str, Path]) -> None:
    """Without root there are no credentials to take: the user's own bound the read."""
    copy = places["dir"].parent / "code"
    shutil.copytree(ROOT / "profkit", copy / "profkit")
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    result = subprocess.run(
        [*AS_NOBODY, SYSTEM_PYTHON, "-c", OWN_FILE, str(places["public"]), str(places["secret"])],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(copy)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        SOURCE.format(token=PUBLIC).splitlines()[1].strip(),
        "refused: [Errno 13] Permission denied",
    ]
