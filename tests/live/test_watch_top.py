"""`profkit top` in a real terminal: tmux runs it, capture-pane reads the screen, `q` quits."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..support import RECIPES, ROOT
from .conftest import StartRecipe

pytestmark = pytest.mark.root
TMUX = shutil.which("tmux")


def copy_site() -> str:
    lines = (RECIPES / "shm_fanout.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "destination.copy_(" in text)
    return f"shm_fanout.py:{line}"


def test_top_in_tmux(start_recipe: StartRecipe, tmp_path: Path) -> None:
    if TMUX is None:
        pytest.skip("no tmux: apt-get install tmux (make test installs it)")
    recipe = start_recipe("shm_fanout.py", cores=0.5, warmup=1.0)
    socket = f"profkit-test-{os.getpid()}"  # a private tmux server, killed below
    status = tmp_path / "status"
    command = (
        f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m profkit top "
        f"--pid {recipe.pid} --interval 1; echo $? > {shlex.quote(str(status))}"
    )
    tmux = [TMUX, "-L", socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "160", "-y", "45", "sh", "-c", command],
        check=True,
        env={**os.environ, "TERM": "xterm-256color"},
    )
    try:
        screen = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True
            ).stdout
            if copy_site() in screen and "quota-oversubscription" in screen:
                break
            time.sleep(0.5)
        assert f"pid {recipe.pid}" in screen, screen
        assert "0.5-core quota" in screen and "throttled" in screen, screen
        assert "openmp" in screen and "regions/s" in screen, screen
        assert copy_site() in screen and "aten::copy_" in screen, screen
        assert (
            "[high] quota-oversubscription" in screen or "[medium] quota-oversubscription" in screen
        )
        throttled = next(line for line in screen.splitlines() if line.startswith("throttled "))
        assert int(throttled.split()[1].rstrip("%")) >= 25, throttled
        quit_at = time.monotonic()
        subprocess.run([*tmux, "send-keys", "q"], check=True)
        while not status.exists() and time.monotonic() - quit_at < 5:
            time.sleep(0.1)
        assert status.exists(), "top did not quit within 5 s of q"
        assert status.read_text().strip() == "0"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert recipe.process.poll() is None  # the target runs on, untouched
