"""`watch` on bad input from real processes: a push server that is down and a target that
exits, where it must keep running and say so once."""

from __future__ import annotations

import re
import time

import pytest

from ..watch_support import agent, free_port
from .conftest import StartRecipe


@pytest.mark.root
def test_unreachable_push_and_exiting_target(start_recipe: StartRecipe) -> None:
    recipe = start_recipe("shm_fanout.py", "--duration", "10")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with agent("--pid", str(recipe.pid), "--interval", "0.5", "--push", dead) as a:
        a.wait_serving()
        deadline = time.monotonic() + 20
        failures = 0.0
        while time.monotonic() < deadline:
            found = re.search(r"^profkit_profile_push_failures_total ([\d.]+)$", a.metrics(), re.M)
            failures = float(found.group(1)) if found else 0.0
            if failures >= 3:
                break
            time.sleep(0.5)
        assert failures >= 3, a.output
        recipe.process.wait(timeout=20)  # the target exits; the agent does not
        time.sleep(1.5)
        assert a.process.poll() is None, a.output
        assert "profkit_targets 0.0" in a.metrics()
        code, _ = a.terminate()
    assert code == 0, a.output
    pushes = [line for line in a.output.splitlines() if "cannot push profiles" in line]
    assert len(pushes) == 1 and "Connection refused" in pushes[0], a.output
    assert "no Python process matches pid" in a.output
