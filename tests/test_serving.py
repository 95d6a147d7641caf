"""The serving recipe gives right answers on every CPU transport; the experiment runner's
order and statistics are right; `run --cap-threads` sets the pool from the quota."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from recipes.mm_serving.experiment import Arm, Config, markdown, plan, summarise
from recipes.mm_serving.load import run_load
from recipes.mm_serving.model import VisionStep, decode_ppm, make_image, preprocess, summary

from .conftest import ROOT, needs_root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def expected(seed: int, image_size: int, model_size: int) -> list[float]:
    """The scheduler's answer for one image, computed in this one process."""
    pixel_values = preprocess(decode_ppm(make_image(seed, image_size, image_size)), model_size)
    return summary(VisionStep()(pixel_values))


def test_ppm_round_trip_keeps_pixels_that_look_like_whitespace() -> None:
    for seed in range(200):
        image = make_image(seed, 8, 6)
        header = len(b"P6\n8 6\n255\n")
        tensor = decode_ppm(image)
        assert bytes(tensor.permute(1, 2, 0).contiguous().numpy().tobytes()) == image[header:]


@pytest.mark.live
@pytest.mark.parametrize("transport", ["shm-torch", "shm-numpy"])
def test_front_and_scheduler_answer_correctly(transport: str) -> None:
    port = free_port()
    front = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "recipes.mm_serving.front",
            "--transport",
            transport,
            "--port",
            str(port),
            "--model-size",
            "224",
            "--threads",
            "2",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert front.stdout is not None
        assert front.stdout.readline().startswith("ready")
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                info = json.loads(urllib.request.urlopen(f"{url}/info", timeout=2).read())
                break
            except OSError:
                time.sleep(0.1)
        assert info["transport"] == transport and info["scheduler_pid"] > 0
        result, answers = asyncio.run(run_load(url, 4, 12, 100, 256))
        assert result.errors == 0, result.error_samples
        assert result.throughput_rps > 0 and result.latency_p50_ms > 0
        for answer in answers:
            want = expected(answer["seed"], 256, 224)
            assert answer["result"] == pytest.approx(want, rel=1e-4, abs=1e-5)
        # Every segment was unlinked by the scheduler.
        assert not [
            n
            for n in os.listdir("/dev/shm")
            if n.startswith("psm_") and Path(f"/dev/shm/{n}").stat().st_mtime > time.time() - 5
        ]
    finally:
        front.send_signal(2)
        front.wait(timeout=30)


ARMS = (
    Arm("A", "shm-torch", "8"),
    Arm("B", "shm-torch", "auto"),
    Arm("C", "shm-numpy", "8"),
    Arm("D", "shm-numpy", "auto"),
)


def test_plan_runs_every_arm_once_per_round_in_shuffled_order() -> None:
    order = plan(ARMS, repeats=5, seed=3)
    assert len(order) == 20
    rounds = [[arm.name for r, arm in order if r == index] for index in range(5)]
    assert all(sorted(names) == ["A", "B", "C", "D"] for names in rounds)
    assert len({tuple(names) for names in rounds}) > 1, "orders differ between rounds"
    assert plan(ARMS, 5, 3) == order and plan(ARMS, 5, 4) != order


def _run(arm: str, throughput: float, p50: float, finding: str) -> dict:
    load = {
        "throughput_rps": throughput,
        "latency_p50_ms": p50,
        "latency_p99_ms": 2 * p50,
        "front_cpu_pct": 100.0,
        "scheduler_cpu_pct": 10.0,
        "errors": 0,
    }
    return {
        "arm": arm,
        "load": load,
        "top_finding": finding,
        "findings": [{"id": finding, "severity": "high"}],
    }


def test_summary_medians_and_spread() -> None:
    runs = [
        _run("A", 10, 900, "cpu-fanout"),
        _run("A", 12, 800, "cpu-fanout"),
        _run("A", 30, 100, "cpu-fanout"),
        _run("B", 100, 90, "none"),
        _run("B", 120, 80, "none"),
        _run("B", 110, 85, "none"),
    ]
    rows = {row["arm"]: row for row in summarise(runs, ARMS[:2])}
    assert rows["A"]["throughput_rps"] == 12 and rows["A"]["throughput_rps_min"] == 10
    assert rows["A"]["throughput_rps_max"] == 30 and rows["A"]["latency_p50_ms"] == 800
    assert rows["B"]["throughput_rps"] == 110
    table = markdown(list(rows.values()), Config(arms=ARMS[:2]))
    assert "| A | 12.0 [10.0-30.0] |" in table
    assert "B vs A: 9.17x throughput (spread 3.33-12.00x)" in table


def test_config_file_loads() -> None:
    for name in ("experiment.json", "experiment-gpu.json", "experiment-2core.json"):
        config = Config.load(ROOT / "recipes/mm_serving" / name)
        assert {arm.transport for arm in config.arms} >= {"shm-torch", "shm-numpy"}
        assert any(arm.threads == "auto" for arm in config.arms)


@needs_root()
def test_run_cap_threads_sets_the_pool_from_the_quota(start_recipe, tmp_path: Path) -> None:
    from profkit.host.sandbox import quota_group

    script = (
        "import os, time, torch\n"
        "print('ready', os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads(),"
        " flush=True)\n"
        "time.sleep(30)\n"
    )
    with quota_group(1.5) as group:
        procs = [str(leaf / "cgroup.procs") for leaf in group.leaf_dirs]

        def join() -> None:
            for path in procs:
                Path(path).write_text(str(os.getpid()))

        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "profkit",
                "run",
                "--cap-threads",
                "--delay",
                "2",
                "--duration",
                "1",
                "--collectors",
                "proc",
                "--out",
                str(tmp_path / "b"),
                "--no-report",
                "--",
                sys.executable,
                "-c",
                script,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=join,
        )
    assert result.returncode == 0, result.stderr
    assert "OMP_NUM_THREADS=1" in result.stderr and "= 1.5 CPUs set by" in result.stderr
    assert "ready 1 1" in result.stdout
    manifest = json.loads((tmp_path / "b/manifest.json").read_text())
    assert manifest["target"]["thread_env"]["OMP_NUM_THREADS"] == "1"


def test_autothreads_apply_in_process() -> None:
    from profkit import autothreads

    before = torch.get_num_threads()
    try:
        cap = autothreads.apply(verbose=False)
        assert cap.torch_set and torch.get_num_threads() == cap.threads
        assert os.environ["OMP_NUM_THREADS"] == str(cap.threads)
        assert cap.threads >= 1 and cap.reason
    finally:
        torch.set_num_threads(before)


def test_steady_load_ends_when_the_server_is_gone() -> None:
    # Nothing listens on this port: every worker sees the server gone, and the process must
    # end rather than go on reporting progress (a leftover load generator is load on the
    # machine that the next benchmark would measure).
    url = f"http://127.0.0.1:{free_port()}"
    options = ["--url", url, "--steady", "--concurrency", "2", "--image-size", "32"]
    load = subprocess.run(
        [sys.executable, "-m", "recipes.mm_serving.load", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert load.returncode == 0, load.stderr
    assert load.stdout.splitlines()[0].startswith("progress done=0 ")
