"""Load generator: fixed concurrency, seeded images, latency, throughput and CPU of both sides.

    python -m recipes.mm_serving.load --url http://127.0.0.1:8000 --concurrency 16 --requests 320

With --steady it runs until interrupted and prints `progress done=N t_ns=T` (CLOCK_MONOTONIC)
every 50 ms, so that a benchmark can read the requests/s of any window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import aiohttp

from .model import make_image

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    requests: int
    errors: int
    seconds: float
    throughput_rps: float
    latency_p50_ms: float
    latency_p99_ms: float
    front_cpu_pct: float
    scheduler_cpu_pct: float
    error_samples: tuple[str, ...] = ()


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def run_load(
    url: str, concurrency: int, requests: int, seed: int, image_size: int, timeout_s: float = 120.0
) -> tuple[LoadResult, list[dict]]:
    images = [make_image(seed + i, image_size, image_size) for i in range(requests)]
    latencies: list[float] = []
    answers: list[dict] = []
    errors = 0
    error_samples: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(requests):
        queue.put_nowait(index)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(f"{url}/info") as response:
            info = await response.json()

        def failed(what: str) -> None:
            nonlocal errors
            errors += 1
            if len(error_samples) < 5:
                error_samples.append(what[:200])

        async def worker() -> None:
            while True:
                try:
                    index = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                started = time.monotonic()
                try:
                    async with session.post(f"{url}/generate", data=images[index]) as response:
                        payload = await response.json(content_type=None)
                        if response.status != 200 or "result" not in payload:
                            failed(f"HTTP {response.status}: {payload}")
                            continue
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    failed(f"{type(exc).__name__}: {exc}")
                    continue
                latencies.append(time.monotonic() - started)
                answers.append({"seed": seed + index, "result": payload["result"]})

        front_before = cpu_seconds(info["front_pid"])
        scheduler_before = cpu_seconds(info["scheduler_pid"])
        began = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.monotonic() - began
        front = cpu_seconds(info["front_pid"]) - front_before
        scheduler = cpu_seconds(info["scheduler_pid"]) - scheduler_before
    result = LoadResult(
        concurrency=concurrency,
        requests=requests,
        errors=errors,
        seconds=seconds,
        throughput_rps=len(latencies) / seconds if seconds else 0.0,
        latency_p50_ms=1000 * percentile(latencies, 50),
        latency_p99_ms=1000 * percentile(latencies, 99),
        front_cpu_pct=100 * front / seconds if seconds else 0.0,
        scheduler_cpu_pct=100 * scheduler / seconds if seconds else 0.0,
        error_samples=tuple(error_samples),
    )
    return result, answers


async def run_steady(url: str, concurrency: int, seed: int, image_size: int) -> None:
    images = [make_image(seed + i, image_size, image_size) for i in range(16)]
    done = 0

    async def worker(offset: int) -> None:
        nonlocal done
        index = offset
        while True:
            index = (index + 1) % len(images)
            try:
                async with session.post(f"{url}/generate", data=images[index]) as response:
                    await response.read()
                    if response.status == 200:
                        done += 1
            except aiohttp.ClientError:
                return  # the server went away: the benchmark is over

    async def report() -> None:
        while True:
            print(f"progress done={done} t_ns={time.monotonic_ns()}", flush=True)
            await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as session:
        reporter = asyncio.create_task(report())
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        # Every worker saw the server go: stop reporting, so that the process ends with it.
        reporter.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--image-size", type=int, default=512)
    parser.add_argument(
        "--steady",
        action="store_true",
        help="load until interrupted at the first --concurrency; print progress",
    )
    args = parser.parse_args(argv)
    if args.steady:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_steady(args.url, args.concurrency[0], args.seed, args.image_size))
        return 0
    results = []
    for concurrency in args.concurrency:
        result, _ = asyncio.run(
            run_load(args.url, concurrency, args.requests, args.seed, args.image_size)
        )
        results.append(asdict(result))
        print(
            f"concurrency {concurrency}: {result.throughput_rps:.1f} req/s, p50 "
            f"{result.latency_p50_ms:.0f} ms, p99 {result.latency_p99_ms:.0f} ms, front CPU "
            f"{result.front_cpu_pct:.0f}%, scheduler CPU {result.scheduler_cpu_pct:.0f}%, "
            f"errors {result.errors}",
            file=sys.stderr,
        )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
