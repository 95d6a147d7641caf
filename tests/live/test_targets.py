"""Target discovery on real processes, and every bad-target path of the CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from profkit.errors import (
    EXIT_NOT_PYTHON,
    EXIT_TARGET_CHANGED,
    TargetChanged,
)
from profkit.host import procfs, target

from ..support import run_profkit
from .conftest import StartRecipe


def test_ps_finds_recipe_with_torch_runtime(start_recipe: StartRecipe) -> None:
    recipe = start_recipe("shm_fanout.py", "--threads", "4", env={"OMP_NUM_THREADS": "4"})
    result = run_profkit("ps", "--match", "shm_fanout", "--json")
    assert result.returncode == 0, result.stderr
    found = {item["pid"]: item for item in json.loads(result.stdout)}
    item = found[recipe.pid]
    assert item["torch"] is True
    gomp = [r for r in item["runtimes"] if r["name"] == "libgomp"]
    assert gomp and gomp[0]["bundled_by_torch"] and "/torch/lib/libgomp" in gomp[0]["path"]
    assert item["threads"] == int(procfs.read_status(recipe.pid)["Threads"])
    assert item["thread_env"]["OMP_NUM_THREADS"] == "4"
    assert item["pool_threads"] == 4


def test_ps_text_lists_the_recipe(start_recipe: StartRecipe) -> None:
    recipe = start_recipe("shm_fanout.py", "--copy", "numpy")
    result = run_profkit("ps", "--match", "shm_fanout")
    assert result.returncode == 0
    assert str(recipe.pid) in result.stdout and "libgomp" in result.stdout


def test_non_python_process() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        result = run_profkit("quota", "--pid", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.returncode == EXIT_NOT_PYTHON
    assert len(result.stderr.strip().splitlines()) == 1
    assert "is not a Python process" in result.stderr


def test_reused_pid_is_detected() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        inspected = target.inspect(process.pid)
        target.ensure_same(inspected)
        # The same pid with another start time is what a reused pid looks like.
        other = dataclasses.replace(inspected, start_ticks=inspected.start_ticks - 1)
        with pytest.raises(TargetChanged) as raised:
            target.ensure_same(other)
        assert raised.value.exit_code == EXIT_TARGET_CHANGED
    finally:
        process.kill()
        process.wait()


def test_python_without_torch_is_a_target_without_torch() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import time

        time.sleep(0.2)
        inspected = target.inspect(process.pid)
        assert inspected.is_python and not inspected.has_torch
        assert inspected.openmp_runtime is None
    finally:
        process.kill()
        process.wait()
