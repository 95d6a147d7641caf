"""The capture session's open, run and close steps and its abort paths, with stand-in collectors
on the test process itself: no root, no tool started (test_hostile.py runs the real ones)."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from profkit.bundle.parts import CollectorResult
from profkit.capture import runs
from profkit.capture import session as session_module
from profkit.capture.collectors.base import Availability, CaptureContext
from profkit.capture.registry import REGISTRY
from profkit.capture.session import CaptureRequest, Progress, capture
from profkit.errors import CaptureFailed, OutputError
from profkit.host.target import Target, inspect

STOPPED: list[str] = []  # the order the stand-ins were stopped in


class StandIn:
    """A collector that starts and stops at once; subclasses fail where the name says."""

    name = ""

    def available(self, target: Target) -> Availability:
        return Availability(True)

    def start(self, context: CaptureContext) -> None:
        self.started = True

    def progress(self) -> int:
        return 3

    def stop(self) -> CollectorResult:
        STOPPED.append(self.name)
        return CollectorResult(self.name, "ok", samples=3)


def stand_in(name: str, base: type = StandIn) -> type:
    return type(f"StandIn_{name}", (base,), {"name": name})


class StartInterrupted(StandIn):
    def start(self, context: CaptureContext) -> None:
        raise KeyboardInterrupt


class StopsOnAFullDisk(StandIn):
    def stop(self) -> CollectorResult:
        STOPPED.append(self.name)
        raise OSError(errno.ENOSPC, "No space left on device")


class NeverAvailable(StandIn):
    def available(self, target: Target) -> Availability:
        return Availability(False, "not here")


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., CaptureRequest]:
    """Stand-ins for proc (a sampler) and perf_record (a tool); the run records in tmp_path."""
    monkeypatch.setattr(runs, "RUN_DIR", tmp_path / "run")
    STOPPED.clear()

    def use(**kinds: type) -> CaptureRequest:
        for name in REGISTRY:
            monkeypatch.setitem(REGISTRY, name, stand_in(name, kinds.get(name, StandIn)))
        return CaptureRequest(
            target=inspect(os.getpid()),
            directory=tmp_path / "bundle",
            duration_s=0.6,
            rate_hz=5,
            collectors=("proc", "perf_record"),
        )

    return use


def manifest_of(request: CaptureRequest) -> dict:
    return json.loads((request.directory / "manifest.json").read_text())


def test_a_capture_opens_runs_and_closes(session: Callable[..., CaptureRequest]) -> None:
    ticks: list[Progress] = []
    request = session()
    manifest = capture(request, on_tick=ticks.append)
    assert json.loads(json.dumps(manifest)) == manifest_of(request)
    assert (manifest["status"], manifest["status_reason"]) == ("complete", "")
    assert manifest["collectors"]["proc"]["status"] == "ok"
    assert manifest["collectors"]["perf_record"]["samples"] == 3
    assert manifest["collectors"]["ebpf"]["status"] == "skipped"
    assert STOPPED == ["proc", "perf_record"], "the samplers stop first"
    assert set(manifest["teardown_s"]) == {"proc", "perf_record"}
    assert ticks and ticks[-1].samples == {"proc": 3, "perf_record": 3}
    assert manifest["window"]["end_ns"] > manifest["window"]["start_ns"]
    assert manifest["options"]["budget"] == {"fraction": 0.02, "tool_cores": 0.5}
    assert not list(runs.RUN_DIR.glob("*.json")), "the run record is removed"


def test_a_stop_ends_the_window_and_keeps_the_bundle_as_partial(
    session: Callable[..., CaptureRequest],
) -> None:
    stop = threading.Event()
    stop.set()
    manifest = capture(session(), stop=stop)
    assert (manifest["status"], manifest["status_reason"]) == ("partial", "stopped early")
    assert STOPPED == ["proc", "perf_record"]


def test_an_interrupt_while_starting_stops_what_started_and_marks_the_bundle_aborted(
    session: Callable[..., CaptureRequest],
) -> None:
    request = session(perf_record=StartInterrupted)
    with pytest.raises(KeyboardInterrupt):
        capture(request)
    manifest = manifest_of(request)
    assert (manifest["status"], manifest["status_reason"]) == ("aborted", "interrupted")
    assert STOPPED == ["proc"]
    assert manifest["collectors"]["proc"]["status"] == "ok"


def test_a_full_disk_at_teardown_aborts_and_says_which_bundle(
    session: Callable[..., CaptureRequest],
) -> None:
    request = session(perf_record=StopsOnAFullDisk)
    with pytest.raises(OutputError, match=f"cannot write {request.directory}: No space left"):
        capture(request)
    manifest = manifest_of(request)
    assert manifest["status"] == "aborted"
    assert manifest["status_reason"] == "a write failed: No space left on device"
    assert manifest["collectors"]["perf_record"]["status"] == "failed"


def test_no_collector_able_to_start_is_an_aborted_bundle(
    session: Callable[..., CaptureRequest],
) -> None:
    request = session(proc=NeverAvailable, perf_record=NeverAvailable)
    with pytest.raises(CaptureFailed):
        capture(request)
    manifest = manifest_of(request)
    assert manifest["status"] == "aborted"
    reason = manifest["status_reason"]
    assert reason.startswith("no collector could start: ") and "; proc: not here;" in reason


def test_an_unexpected_exception_in_the_window_marks_the_bundle_aborted(
    session: Callable[..., CaptureRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(target: Target) -> str | None:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(session_module, "target_state", failing)
    request = session()
    with pytest.raises(RuntimeError):
        capture(request)
    manifest = manifest_of(request)
    assert manifest["status"] == "aborted"
    assert manifest["status_reason"] == "internal error: RuntimeError: injected fault"
    assert STOPPED == ["proc", "perf_record"]
