"""The capture plan: collectors, py-spy's mode and rate, and the notes, decided before anything
starts. The target is this test process and nothing is attached; py-spy's mode and rate are
planned whether or not it is in the set, as the manifest records them either way."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from profkit.capture.budget import Budget, PySpyMode, auto_mode, default_rate, pyspy_stop_part
from profkit.capture.collectors.base import CaptureOptions
from profkit.capture.plan import plan_capture, usable_cpus
from profkit.host.target import Target, inspect


def this_process(threads: int) -> Target:
    return replace(inspect(os.getpid()), threads=threads, has_torch=True)


def test_auto_mode_and_the_default_rate_come_from_the_budget() -> None:
    target = this_process(9)
    options = CaptureOptions(budget=Budget(fraction=0.05), pyspy_mode="auto")
    plan = plan_capture(target, "proc", None, options)
    cpus, stops = usable_cpus(target.pid), pyspy_stop_part(probes=False)
    mode, reason = auto_mode(9, 0.05, cpus, stops)
    assert (plan.options.pyspy_mode, plan.options.pyspy_mode_reason) == (mode, reason)
    assert plan.rate_hz == default_rate(9, 0.05, mode, cpus, stops)
    assert plan.collectors == ("proc",) and plan.unavailable == {}
    assert plan.options.budget == options.budget


def test_a_tiny_budget_sends_pyspy_nonblocking_and_says_why() -> None:
    options = CaptureOptions(budget=Budget(fraction=0.001), pyspy_mode="auto")
    plan = plan_capture(this_process(65), "proc,pyspy", 7, options)
    assert plan.options.pyspy_mode == "nonblocking"
    assert plan.rate_hz == 7, "a rate asked for is kept"
    goes = [note for note in plan.notes if note.startswith("py-spy goes --nonblocking: ")]
    assert len(goes) == 1 and "0.1% budget" in goes[0], plan.notes
    # Nothing else places the pool (no eBPF in the set): the one command that would.
    budget = plan.options.pyspy_native_budget
    assert budget is not None and budget > 0.001
    assert plan.notes[-1] == (
        "note: without eBPF or native frames the pool gets no call site: "
        f"`profkit attach --pid {os.getpid()} --pyspy-mode native --budget {100 * budget:g}` "
        "would give one"
    )
    # Without py-spy in the set the mode is still planned (the manifest records it), but a
    # note about a tool that does not run would mislead.
    plan = plan_capture(this_process(65), "proc", 7, options)
    assert plan.options.pyspy_mode == "nonblocking"
    assert not any("py-spy" in note for note in plan.notes), plan.notes


@pytest.mark.parametrize("mode", ["native", "nonblocking"])
def test_a_mode_asked_for_is_kept_without_a_note(mode: PySpyMode) -> None:
    options = CaptureOptions(budget=Budget(fraction=0.001), pyspy_mode=mode)
    plan = plan_capture(this_process(65), "proc", None, options)
    assert (plan.options.pyspy_mode, plan.options.pyspy_mode_reason, plan.notes) == (mode, "", ())


def test_a_target_without_torch_is_noted() -> None:
    target = replace(this_process(2), has_torch=False)
    plan = plan_capture(target, "proc", None, CaptureOptions())
    assert plan.notes == (f"note: pid {target.pid} has no torch loaded; capturing anyway",)
