"""The serving recipe's processes: front and scheduler answer right on every CPU transport, the
load generator ends when the server is gone, and `run --cap-threads` sets the pool from the
quota."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from recipes.launch import attach_args, join_quota
from recipes.mm_serving.load import run_load
from recipes.mm_serving.model import VisionStep, decode_ppm, make_image, preprocess, summary

from ..support import ROOT, run_profkit
from ..watch_support import free_port
from .conftest import StartRecipe


def expected(seed: int, image_size: int, model_size: int) -> list[float]:
    """The scheduler's answer for one image, computed in this one process."""
    pixel_values = preprocess(decode_ppm(make_image(seed, image_size, image_size)), model_size)
    return summary(VisionStep()(pixel_values))


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
        # Every segment this front made was unlinked by the scheduler (other tests' processes
        # may be making their own meanwhile).
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"psm_{front.pid}_")]
    finally:
        front.send_signal(2)
        front.wait(timeout=30)


@pytest.mark.root
def test_run_cap_threads_sets_the_pool_from_the_quota(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    from profkit.host.sandbox import quota_group

    # The command says what its pool is once torch has loaded, however long that takes beside
    # the other lanes (over the 3 s of --delay and --duration in one run): profkit leaves it
    # running, and the pipe it writes to closes when it exits on its own.
    script = (
        "import os, time, torch\n"
        "print('ready', os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads(),"
        " flush=True)\n"
        "time.sleep(5)\n"
    )
    with quota_group(1.5) as group:
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
                "--keep-running",
                "--",
                sys.executable,
                "-c",
                script,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=join_quota(group),
        )
    assert result.returncode == 0, result.stderr
    assert "OMP_NUM_THREADS=1" in result.stderr and "= 1.5 CPUs set by" in result.stderr
    assert "ready 1 1" in result.stdout
    manifest = json.loads((tmp_path / "b/manifest.json").read_text())
    assert manifest["target"]["thread_env"]["OMP_NUM_THREADS"] == "1"


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


# One client at a time is a server's pace, a few hundred regions a second. Four clients on a
# 64-thread pool is the overhead benchmark's serving cell: ~900 regions a second, over the
# region probes' own 15% of a 2% budget, within it once py-spy's parts are theirs too.
@pytest.mark.parametrize(("threads", "clients"), [(0, 1), (64, 4)], ids=["default-1", "64-4"])
def test_serving_front_regions_carry_their_python_stack(
    tmp_path: Path, threads: int, clients: int
) -> None:
    """The serving front copies each request's image into shared memory from its handler
    threads: at default settings, every region the front's pool runs carries the Python stack
    that dispatched it (the eBPF walker), and the copy line is the pool's top site."""
    port = free_port()
    pool_args = ["--threads", str(threads)] if threads else []
    front = subprocess.Popen(
        [sys.executable, "-u", "-m", "recipes.mm_serving.front", "--port", str(port), *pool_args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    load = None
    try:
        assert front.stdout is not None
        assert front.stdout.readline().startswith("ready")
        url = f"http://127.0.0.1:{port}"
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "recipes.mm_serving.load",
                "--url",
                url,
                "--steady",
                "--concurrency",
                str(clients),
                "--image-size",
                "256",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        time.sleep(3)  # the server warm and the load steady
        out = tmp_path / "b"
        captured = run_profkit(*attach_args(front.pid, duration=4.0, out=out, report=False))
        assert captured.returncode == 0, captured.stderr
        reported = run_profkit("report", str(out), "--format", "json")
        assert reported.returncode == 0, reported.stderr
        report = json.loads(reported.stdout)
        ebpf = json.loads((out / "ebpf.json").read_text())
        assert ebpf["regions_decision"]["traced"] is True, ebpf["regions_decision"]
        pool = next(p for p in report["pools"] if p["runtime"] == "openmp")
        assert pool["regions"] > 0 and pool["regions_with_stack"] >= 0.99 * pool["regions"], pool
        rows = [r for r in report["attribution"] if r["pool"] == "openmp"]
        assert rows and rows[0]["method"] == "stack", rows
        assert all(r["method"] == "stack" for r in rows), rows
        # The case's copy into shared memory is one of the sites, placed by its own stack.
        assert any(r["function"].startswith("to_shared_mem") for r in rows), rows
    finally:
        if load is not None:
            load.terminate()
            load.wait(timeout=30)
        front.send_signal(2)
        front.wait(timeout=30)
