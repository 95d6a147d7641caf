"""The live tests' fixtures: real recipe processes, optionally inside a real cgroup quota."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import pytest

from profkit.host import procfs
from profkit.host.sandbox import QuotaGroup, quota_group
from recipes.launch import attach_args, join_quota

from ..support import RECIPES, ROOT, run_profkit


class Recipe:
    """A running recipe process; stopped (never left stopped) when the test ends.

    Its output is read all the time by a thread: a recipe that prints progress into a pipe
    nobody reads would block in write() once the pipe fills, and a test would then profile a
    blocked process."""

    def __init__(self, process: subprocess.Popen[str], group: QuotaGroup | None) -> None:
        self.process = process
        self.group = group
        self.pid = process.pid
        self.output = ""
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="recipe-output", daemon=True)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def start_reading(self) -> None:
        self._reader.start()

    def readline(self, timeout: float) -> str:
        """The next line the recipe printed, or "" if none came within timeout seconds."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return ""
        self.output += line
        return line

    def stop(self) -> str:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
                self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        while not self._lines.empty():
            self.output += self._lines.get()
        return self.output

    def copies(self) -> int:
        for line in reversed(self.output.splitlines()):
            if line.startswith("copies="):
                return int(line.split()[0].split("=")[1])
        raise AssertionError(f"recipe printed no summary: {self.output!r}")


def _start(
    args: list[str],
    group: QuotaGroup | None,
    env: dict[str, str] | None,
    python: str | None = None,
    nice: int = 0,
) -> Recipe:
    joined = join_quota(group)

    def preexec() -> None:
        if joined is not None:
            joined()
        if nice:
            os.nice(nice)

    process = subprocess.Popen(
        [python or sys.executable, "-u", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=preexec if joined is not None or nice else None,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    recipe = Recipe(process, group)
    assert process.stdout is not None
    first = process.stdout.readline()  # the recipe prints its header once torch is loaded
    recipe.output = first
    recipe.start_reading()
    if not first.startswith(("shm_fanout", "ready")):
        recipe.stop()
        raise AssertionError(f"recipe failed to start: {recipe.output}")
    return recipe


# What a module's shared-capture fixture gives: the bundle's directory and the recipe it captured.
Captured: TypeAlias = tuple[Path, Recipe]


class StartRecipe(Protocol):
    """What the start_recipe fixture gives: start(script, *args, ...) -> Recipe."""

    def __call__(
        self,
        script: str,
        *args: str,
        cores: float | None = None,
        on_parent: bool = False,
        env: dict[str, str] | None = None,
        warmup: float = 0.5,
        python: str | None = None,
        nice: int = 0,
        favoured: bool = True,
    ) -> Recipe: ...


@pytest.fixture
def start_recipe() -> Iterator[StartRecipe]:
    """start_recipe(script, *args, cores=None, on_parent=False, env=None, warmup=0.5,
    python=None, nice=0, favoured=True): python is another interpreter to run the recipe with;
    nice, a niceness for it (negative: ahead of the other lanes' processes); favoured, the quota
    group's highest CPU weight (see quota_group), for a quota the recipe should be throttled by."""
    started: list[Recipe] = []
    stack = contextlib.ExitStack()

    def start(
        script: str,
        *args: str,
        cores: float | None = None,
        on_parent: bool = False,
        env: dict[str, str] | None = None,
        warmup: float = 0.5,
        python: str | None = None,
        nice: int = 0,
        favoured: bool = True,
    ) -> Recipe:
        # Favoured: the other lanes' processes must not keep the recipe below the quota that is
        # meant to throttle it.
        group = (
            stack.enter_context(quota_group(cores, on_parent=on_parent, favoured=favoured))
            if cores
            else None
        )
        recipe = _start([str(RECIPES / script), *args], group, env, python, nice)
        started.append(recipe)
        time.sleep(warmup)
        return recipe

    with stack:
        yield start
        for recipe in started:
            recipe.stop()
            state = _state(recipe.pid)
            assert state != "T", "a test left a recipe stopped"


def _state(pid: int) -> str | None:
    try:
        return procfs.read_stat(pid).state
    except FileNotFoundError:
        return None


def attach(
    pid: int,
    out: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    duration: float = 4.0,
    hide: tuple[str, ...] = (),
    **flags: Any,
) -> subprocess.CompletedProcess[str]:
    """`profkit attach` without the report, as the tests run it (`hide`: as run_profkit)."""
    args = attach_args(pid, duration=duration, out=out, report=False, extra=extra, **flags)
    return run_profkit(*args, env=env, timeout=180, hide=hide)
