"""profkit.host.pyruntime: CPython layouts, thread states, frame walks and line tables.

These tests start pyruntime_target.py (beside this file) under each interpreter found on the
machine and read it from outside, comparing with what the target's own interpreter reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from profkit.host.pyruntime import (
    CodeInfo,
    CodeResolver,
    Layout,
    PyRuntimeUnsupported,
    detect,
    self_check,
    thread_states,
    walk,
)

TARGET = Path(__file__).resolve().parent / "pyruntime_target.py"
PYENV = Path("/root/.pyenv/versions")

# Debian sid's 3.14 and 3.15 (libpython in a non-PIE executable), which `make test`'s setup
# fetches (scripts/fetch_cpython.sh): their absence is a failed setup, not a skip.
NEW_PYTHONS = Path(__file__).resolve().parents[2] / ".cache" / "cpython"
INTERPRETERS = {
    "3.10": (PYENV / "3.10.13/bin/python3", (3, 10)),
    "3.11": (PYENV / "3.11.7/bin/python3", (3, 11)),
    "3.12": (PYENV / "3.12.1/bin/python3", (3, 12)),
    "3.13": (PYENV / "3.13.0/bin/python3", (3, 13)),
    "3.11-static": (Path("/usr/bin/python3.11"), (3, 11)),
    "3.14-debian": (NEW_PYTHONS / "3.14/run", (3, 14)),
    "3.15-debian": (NEW_PYTHONS / "3.15/run", (3, 15)),
}
REQUIRED = {"3.14-debian", "3.15-debian"}
UNSUPPORTED = {"3.9": PYENV / "3.9.18/bin/python3"}


def _labels() -> dict[str, int]:
    lines: dict[str, int] = {}
    for number, text in enumerate(TARGET.read_text().splitlines(), start=1):
        match = re.search(r"# at:(\w+)", text)
        if match:
            lines[match.group(1)] = number
    return lines


LABELS = _labels()
# (qualname, name, label) innermost first; 3.10 code objects have no qualname.
MAIN_STACK = [
    ("函数", "函数", "ucs2"),
    ("café", "café", "latin1"),
    ("f1", "f1", "f1"),
    ("main", "main", "main"),
    ("<module>", "<module>", "module"),
]
WORKER_STACK = [
    ("waiter", "waiter", "waiter"),
    ("Worker.step", "step", "step"),
    ("Worker.run", "run", "run"),
]


@dataclass
class Target:
    key: str
    version: tuple[int, int]
    process: subprocess.Popen[str]
    main_tid: int
    worker_tid: int
    dump: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def _wait_ready(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if selector.select(timeout=0.2):
                line = process.stdout.readline()
                if line.startswith("ready"):
                    return line
                if not line:
                    break
    finally:
        selector.close()
    raise AssertionError(f"target did not get ready (rc={process.poll()})")


@contextlib.contextmanager
def running_target(
    python: Path, dump: Path, *extra: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [str(python), str(TARGET), str(dump), *extra],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        encoding="utf-8",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONIOENCODING": "utf-8"},
    )
    try:
        yield process, _wait_ready(process, timeout=60)
    finally:
        process.kill()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="module", params=list(INTERPRETERS))
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    if os.geteuid() != 0:
        pytest.skip("needs root (reads other processes)")
    python, version = INTERPRETERS[request.param]
    if not python.exists():
        if request.param in REQUIRED:
            pytest.fail(f"{python} is missing: scripts/setup.sh --test fetches it")
        pytest.skip(f"{python} not installed")
    dump = tmp_path_factory.mktemp("pyruntime") / "code.json"
    with running_target(python, dump) as (process, ready):
        _, main_tid, worker_tid = ready.split()
        yield Target(request.param, version, process, int(main_tid), int(worker_tid), dump)


def _user_stack(
    resolver: CodeResolver, frames: list[tuple[int, int]]
) -> list[tuple[str, int | None]]:
    out = []
    for code, index in frames:
        info = resolver.resolve(code)
        assert info is not None, f"code {code:#x} did not resolve"
        if info.filename == str(TARGET):
            out.append((info.qualname, resolver.line(code, index)))
    return out


def _expected(target: Target, stack: list[tuple[str, str, str]]) -> list[tuple[str, int]]:
    use_qualname = target.version >= (3, 11)
    return [(qual if use_qualname else name, LABELS[label]) for qual, name, label in stack]


@pytest.mark.root
def test_detect_version_and_layout(target: Target) -> None:
    layout = detect(target.pid)
    assert isinstance(layout, Layout)
    assert layout.version == target.version
    assert layout.frame_kind == (
        "frameobject"
        if target.version == (3, 10)
        else "direct"
        if target.version >= (3, 13)
        else "cframe"
    )
    # 3.14 tags a frame's code reference (a _PyStackRef); the walker masks the tag off.
    assert layout.code_tag == (3 if target.version >= (3, 14) else 0)
    if target.version >= (3, 13):
        assert layout.source == "_Py_DebugOffsets"
    else:
        assert "PyCode_Type members" in layout.source
    assert layout.frame_span() >= layout.frame_code + 8


@pytest.mark.root
def test_thread_states_find_both_threads(target: Target) -> None:
    states = thread_states(target.pid, detect(target.pid))
    assert target.main_tid in states
    assert target.worker_tid in states
    assert states[target.main_tid] != states[target.worker_tid]


@pytest.mark.root
def test_self_check_passes(target: Target) -> None:
    self_check(target.pid, detect(target.pid))


@pytest.mark.root
def test_walk_gives_expected_user_frames(target: Target) -> None:
    layout = detect(target.pid)
    resolver = CodeResolver(target.pid, layout)
    expected_main = _expected(target, MAIN_STACK)
    expected_worker = _expected(target, WORKER_STACK)
    # The main thread prints "ready" just before entering its nest: allow it a moment.
    deadline = time.monotonic() + 10
    while True:
        states = thread_states(target.pid, layout)
        main = _user_stack(resolver, walk(target.pid, layout, states[target.main_tid]))
        worker = _user_stack(resolver, walk(target.pid, layout, states[target.worker_tid]))
        if (main, worker) == (expected_main, expected_worker) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert main == expected_main
    assert worker == expected_worker
    # The worker is parked in threading.Event.wait: stdlib frames sit above the user ones.
    frames = walk(target.pid, layout, states[target.worker_tid])
    innermost = resolver.resolve(frames[0][0])
    assert innermost is not None and innermost.filename.endswith("threading.py")
    assert len(walk(target.pid, layout, states[target.main_tid], max_frames=2)) == 2


@pytest.mark.root
def test_code_objects_match_interpreter(target: Target) -> None:
    """Names and the line of every code unit agree with the target interpreter's own view."""
    layout = detect(target.pid)
    resolver = CodeResolver(target.pid, layout)
    records = json.loads(target.dump.read_text())
    assert len(records) > 100
    units = 0
    for record in records:
        info = resolver.resolve(record["addr"])
        assert info == CodeInfo(
            record["filename"], record["name"], record["qualname"], record["firstlineno"]
        )
        for index, line in enumerate(record["lines"]):
            assert resolver.line(record["addr"], index) == line, (record["qualname"], index)
            units += 1
    assert units > 1000


@pytest.mark.root
def test_resolver_rejects_non_code(target: Target) -> None:
    layout = detect(target.pid)
    resolver = CodeResolver(target.pid, layout)
    # The runtime state is readable memory but not a code object; 8 is never mapped.
    assert resolver.resolve(layout.runtime_addr) is None
    assert resolver.resolve(8) is None
    assert resolver.line(8, 0) is None


@pytest.mark.root
@pytest.mark.parametrize("key", ["3.10", "3.12", "3.13"])
def test_self_check_tolerates_running_thread(key: str, tmp_path: Path) -> None:
    """A thread executing Python while it is read must not make the check fail."""
    python = INTERPRETERS[key][0]
    if not python.exists():
        pytest.skip(f"{python} not installed")
    with running_target(python, tmp_path / "code.json", "--spin") as (process, _):
        layout = detect(process.pid)
        resolver = CodeResolver(process.pid, layout)
        names: set[str] = set()
        for _ in range(20):
            self_check(process.pid, layout)
            for tstate in thread_states(process.pid, layout).values():
                for code, _index in walk(process.pid, layout, tstate):
                    info = resolver.resolve(code)
                    if info is not None:
                        names.add(info.name)
        assert "spin" in names


# Imports the same modules again and again, from source: running module bodies, the thread
# shows no current frame for a moment many times a second (as while `import torch` runs,
# when watch finds an OpenMP runtime and checks the walker).
REIMPORT = """
import sys
while True:
    for name in ("json", "json.decoder", "json.scanner", "json.encoder"):
        sys.modules.pop(name, None)
    import json
"""


@pytest.mark.root
def test_self_check_passes_while_the_target_imports() -> None:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    process = subprocess.Popen([str(INTERPRETERS["3.11"][0]), "-c", REIMPORT], env=env)
    try:
        time.sleep(0.5)  # past the interpreter's start-up, into the loop
        layout = detect(process.pid)
        # One sweep alone finds no frame about 3 times in 100 here; 100 checks in a row pass
        # only when a frameless moment is looked at again.
        for _ in range(100):
            self_check(process.pid, layout)
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.mark.root
@pytest.mark.parametrize("key", list(UNSUPPORTED))
def test_unsupported_interpreter_is_refused(key: str, tmp_path: Path) -> None:
    python = UNSUPPORTED[key]
    if not python.exists():
        pytest.skip(f"{python} not installed")
    with (
        running_target(python, tmp_path / "code.json") as (process, _),
        pytest.raises(PyRuntimeUnsupported, match=r"3\.9 is not supported"),
    ):
        detect(process.pid)


@pytest.mark.root
def test_non_python_process_is_refused() -> None:
    process = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(PyRuntimeUnsupported, match="_PyRuntime"):
            detect(process.pid)
    finally:
        process.kill()
        process.wait()
