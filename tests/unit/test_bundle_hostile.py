"""Bundles made to hurt whoever reads them: a recorded bundle copied and one part broken, read by
`report`, `flame`, `export` and `timeline` through the command line. Each gives one line, the
documented code (8, or 5 for a part this user may not read), at once, and writes nothing."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from profkit.bundle.load import MAX_DEPTH, nesting
from profkit.errors import EXIT_BAD_BUNDLE, EXIT_PERMISSION, EXIT_USAGE

from ..support import DATA, ROOT, one_line, profkit_as_other_user

RECORDED = DATA / "fanout_quota"
DEEP = "[" * 100_000 + "]" * 100_000
# A reader that reads /dev/zero, or a part past the bound, stops here: out of address space
# (4 GiB; a report of the recorded bundles runs within 1) rather than out of the machine's
# memory, and a hang ends at the timeout.
ADDRESS_SPACE = 4 << 30
TIMEOUT_S = 30
PROMPT_S = 10  # a refusal takes 0.4 s; this leaves room for a loaded machine


def run_bounded(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    return subprocess.run(
        [sys.executable, "-m", "profkit", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=ROOT,
        preexec_fn=cap,
        # One BLAS thread: numpy's pool reserves address space per thread.
        env={
            **os.environ,
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1",
            **(env or {}),
        },
    )


def commands(bundle: Path, out: Path) -> dict[str, list[str]]:
    return {
        "report": ["report", str(bundle), "--format", "json"],
        "flame": ["flame", str(bundle), "-o", str(out / "flame.svg")],
        "export": ["export", str(bundle), "--format", "folded", "-o", str(out / "stacks.folded")],
        "timeline": ["timeline", str(bundle), "-o", str(out / "trace.json")],
    }


def edit(part: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    """Change one part's JSON (json.dumps writes inf and nan as Infinity and NaN, which Python's
    parser reads back)."""

    def damage(bundle: Path) -> None:
        data = json.loads((bundle / part).read_text())
        change(data)
        (bundle / part).write_text(json.dumps(data))

    return damage


def replace(part: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(bundle: Path) -> None:
        (bundle / part).unlink()
        make(bundle / part)

    return damage


def device(path: Path) -> None:
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero's
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")


def sparse(path: Path) -> None:
    with path.open("wb") as handle:
        handle.truncate(257 << 20)  # past the 256 MB bound, and never read


def setitem(path: tuple[str | int, ...], value: object) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return change


def dispatched_part(how: int, stack: int) -> dict:
    """The walker's part of ebpf.json with one sample of a worker and no stacks."""
    columns = {key: [1] for key in ("t_ns", "tid", "dispatcher")}
    samples = {"rate_hz": 99, **columns, "how": [how], "stack": [stack]}
    return {"walker": "on", "stacks": [], "dispatched": samples}


CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "100 000-deep part": (
        lambda b: (b / "proc.json").write_text(DEEP),
        f"proc.json nests deeper than {MAX_DEPTH} levels",
    ),
    "100 000-deep value in the manifest": (
        lambda b: (b / "manifest.json").write_text(
            (b / "manifest.json").read_text().rstrip()[:-1] + f', "extra": {DEEP}}}'
        ),
        "manifest.json nests deeper than",
    ),
    "a list where an object is due": (
        edit("proc.json", setitem(("samples",), [])),
        "proc.json: samples is a list, not an object",
    ),
    "a string where a number is due": (
        edit("proc.json", setitem(("clock_ticks",), "100")),
        'proc.json: clock_ticks is a string ("100"), not an integer',
    ),
    "a string in a column": (
        edit("proc.json", setitem(("samples", "utime", 5), "7")),
        'proc.json: samples.utime holds a string ("7"), not a number',
    ),
    "a string schema_version": (
        edit("manifest.json", setitem(("schema_version",), "1")),
        'manifest.json: schema_version is a string ("1"), not an integer',
    ),
    "a fractional schema_version": (
        edit("manifest.json", setitem(("schema_version",), 0.5)),
        "manifest.json: schema_version is 0.5, not an integer",
    ),
    "an infinite count": (
        edit("proc.json", setitem(("samples", "utime", 0), float("inf"))),
        "proc.json: samples.utime holds inf, not a finite number",
    ),
    "a NaN count": (
        edit("cgroup.json", setitem(("samples", "nr_throttled", 3), float("nan"))),
        "cgroup.json: samples.nr_throttled holds nan, not a finite number",
    ),
    "a negative count": (
        edit("proc.json", setitem(("process", "stime", 0), -5)),
        "proc.json: process.stime holds -5, negative",
    ),
    "an infinite quota": (
        edit("manifest.json", setitem(("quota", "effective_cores"), float("inf"))),
        "manifest.json: quota.effective_cores is inf, not a finite number",
    ),
    "a NaN quota": (
        edit("manifest.json", setitem(("quota", "effective_cores"), float("nan"))),
        "manifest.json: quota.effective_cores is nan, not a finite number",
    ),
    "a quota of no cores": (
        edit("cgroup.json", setitem(("effective_cores",), 0)),
        "cgroup.json: effective_cores is 0, below 0.001",
    ),
    "spans that stand for petabytes of samples": (
        edit("manifest.json", setitem(("collectors", "pyspy", "notes", "rate_hz"), 10**15)),
        "pyspy.json: spans stand for 2.93e+15 samples, more than",
    ),
    "a manifest target that is a list": (
        edit("manifest.json", setitem(("target",), [])),
        "manifest.json: target is a list, not an object",
    ),
    "a stack index past its table": (
        edit("pyspy.json", setitem(("spans", "stack", 0), 10**6)),
        "pyspy.json: spans.stack holds 1000000, past the",
    ),
    "columns of unequal length": (
        edit("proc.json", lambda d: d["samples"]["tid"].pop()),
        "proc.json: samples: its columns differ in length",
    ),
    "a wakeup that is not numbers": (
        edit("ebpf.json", setitem(("wakeups", 0), ["a", 1, 2])),
        'ebpf.json: wakeups[0] is a string ("a"), not an integer',
    ),
    "a dispatcher chosen no known way": (
        edit("ebpf.json", setitem(("python",), dispatched_part(how=7, stack=0))),
        "ebpf.json: python.dispatched.how holds a value other than [0, 1, 2]",
    ),
    "a dispatched sample past the stacks": (
        edit("ebpf.json", setitem(("python",), dispatched_part(how=1, stack=1))),
        "ebpf.json: python.dispatched.stack holds 1, past the 0 entries of python.stacks",
    ),
    "a perf frame that is a number": (
        edit("perf.json", setitem(("frames", 0), 5)),
        "perf.json: frames[0] is 5, not a frame",
    ),
    "a FIFO as a part": (replace("proc.json", os.mkfifo), "proc.json is a FIFO"),
    "a FIFO as the manifest": (replace("manifest.json", os.mkfifo), "manifest.json is a FIFO"),
    "a link to /dev/zero": (
        replace("ebpf.json", lambda p: p.symlink_to("/dev/zero")),
        "ebpf.json is a symbolic link",
    ),
    "a device as a part": (replace("perf.json", device), "perf.json is a character device"),
    "a part past the bound": (replace("ebpf.json", sparse), "ebpf.json is over 256 MB"),
}


def refused(case: str, tmp_path: Path, readers: tuple[str, ...]) -> None:
    damage, message = CASES[case]
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    shutil.copytree(RECORDED, bundle)
    out.mkdir()
    damage(bundle)
    for command in readers:
        args = commands(bundle, out)[command]
        started = time.monotonic()
        result = run_bounded(*args)
        took = time.monotonic() - started
        assert result.returncode == EXIT_BAD_BUNDLE, (command, result.stderr)
        line = one_line(result)
        assert message in line and str(bundle) in line, (command, line)
        assert took < PROMPT_S, (command, took)
        assert result.stdout == "" and list(out.iterdir()) == [], command


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_bundle_is_one_line_and_exit_8(case: str, tmp_path: Path) -> None:
    refused(case, tmp_path, ("report",))


# Every reader takes the bundle through the one loader (bundle/read.py's load_bundle, which checks
# every part as it reads it) before anything of its own. So each other reader is tried on one
# damage of each kind (the file's type, its size, its depth, a value, an index), and every damage
# on report above: a command apiece costs most of a second.
EVERY_KIND = [
    "a FIFO as a part",
    "a link to /dev/zero",
    "a part past the bound",
    "100 000-deep part",
    "a NaN quota",
    "a stack index past its table",
]


@pytest.mark.parametrize("case", EVERY_KIND)
def test_every_reader_refuses_the_same_way(case: str, tmp_path: Path) -> None:
    refused(case, tmp_path, ("flame", "export", "timeline"))


def readable_bundle() -> Path:
    """A copy of the recorded bundle that any user can reach and read (under a fresh 0755
    directory: pytest's own is 0700)."""
    top = Path(tempfile.mkdtemp(prefix="profkit-bundle-"))
    top.chmod(0o755)
    bundle = top / "bundle"
    shutil.copytree(RECORDED, bundle)
    bundle.chmod(0o755)
    for path in bundle.iterdir():
        path.chmod(0o644)
    return bundle


@pytest.mark.parametrize("part", ["manifest.json", "proc.json", "."])
def test_a_part_this_user_may_not_read_is_exit_5(part: str) -> None:
    # As root the tests run profkit as nobody, who may not read root's 0600 part; as another
    # user they run it as themselves, who may not read a 0000 one.
    bundle = readable_bundle()
    try:
        (bundle / part).chmod((0o700 if part == "." else 0o600) if os.geteuid() == 0 else 0)
        for command in ("report", "flame", "export"):
            args = commands(bundle, Path("."))[command]
            started = time.monotonic()
            result, left = profkit_as_other_user(*args)
            assert result.returncode == EXIT_PERMISSION, (command, result.stderr)
            line = one_line(result)
            named = bundle if part == "." else bundle / part
            assert f"cannot read {named}: permission denied" in line, line
            assert left == [] and time.monotonic() - started < 30, command
    finally:
        bundle.chmod(0o700)
        shutil.rmtree(bundle.parent)


def test_the_bound_is_the_readers_to_raise_or_lower(tmp_path: Path) -> None:
    lowered = run_bounded("report", str(RECORDED), env={"PROFKIT_MAX_PART_MB": "0.01"})
    assert lowered.returncode == EXIT_BAD_BUNDLE
    assert "is over 0.01 MB, the most a part may be (PROFKIT_MAX_PART_MB" in one_line(lowered)
    for bad in ("nan", "0", "-1", "lots"):
        result = run_bounded("report", str(RECORDED), env={"PROFKIT_MAX_PART_MB": bad})
        assert result.returncode == EXIT_USAGE, bad
        assert "is not a positive number of MB" in one_line(result)


def test_brackets_inside_strings_do_not_nest() -> None:
    assert nesting(b'{"code": "x[[[[[", "a": [[1], {"b": "]]]]"}]}') == 3
    assert nesting(b'["a \\" [[[[", [["\\\\"]]]') == 3
    assert nesting(b"") == 0
    # A string of closing brackets does not hide the nesting after it.
    assert nesting(b'["' + b"]" * 1000 + b'", ' + b"[" * 100 + b"]" * 100 + b"]") > MAX_DEPTH
