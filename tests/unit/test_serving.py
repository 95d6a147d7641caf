"""The serving recipe's parts in this process: images round-trip, the experiment runner's order
and statistics are right, the thread cap applies in process."""

from __future__ import annotations

import os

import torch

from recipes.mm_serving.experiment import Arm, Config, markdown, plan, summarise
from recipes.mm_serving.model import decode_ppm, make_image

from ..support import ROOT


def test_ppm_round_trip_keeps_pixels_that_look_like_whitespace() -> None:
    for seed in range(200):
        image = make_image(seed, 8, 6)
        header = len(b"P6\n8 6\n255\n")
        tensor = decode_ppm(image)
        assert bytes(tensor.permute(1, 2, 0).contiguous().numpy().tobytes()) == image[header:]


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
