"""The fix experiment: arms × repeats, fresh servers, shuffled order, profkit's verdict per arm.

    python -m recipes.mm_serving.experiment --config recipes/mm_serving/experiment.json \
        --out results/

Each run starts a fresh front (inside a fresh cgroup quota when the config sets one), warms it
up, measures one load run without any profiler attached, then attaches `profkit attach` to the
front for a fixed window while a second load runs, and keeps the top finding. Within a round
every arm runs once, in an order shuffled by the config's seed. The output is a markdown table
like the case study's (medians, with min-max spread) and a JSON file of every run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from profkit.errors import CgroupError  # noqa: E402
from profkit.host.sandbox import QuotaGroup, quota_group  # noqa: E402
from recipes.launch import attach_command, join_quota  # noqa: E402
from recipes.mm_serving.load import run_load  # noqa: E402


@dataclass(frozen=True)
class Arm:
    name: str
    transport: str = "shm-torch"
    threads: str = "default"  # "default", "auto" (profkit.autothreads) or a number


@dataclass(frozen=True)
class Config:
    arms: tuple[Arm, ...]
    repeats: int = 3
    concurrency: int = 16
    requests: int = 160
    warmup: int = 16
    image_size: int = 512
    model_size: int = 448
    quota_cores: float | None = 2.0
    profile_seconds: float = 4.0
    profile_collectors: str = ""
    seed: int = 7

    @staticmethod
    def load(path: Path) -> Config:
        data = json.loads(path.read_text())
        arms = tuple(Arm(**arm) for arm in data.pop("arms"))
        return Config(arms=arms, **data)


def plan(arms: tuple[Arm, ...], repeats: int, seed: int) -> list[tuple[int, Arm]]:
    """(round, arm) in run order: every arm once per round, rounds shuffled independently."""
    rng = random.Random(seed)
    order = []
    for round_index in range(repeats):
        shuffled = list(arms)
        rng.shuffle(shuffled)
        order += [(round_index, arm) for arm in shuffled]
    return order


def summarise(runs: list[dict], arms: tuple[Arm, ...]) -> list[dict]:
    """Per arm: the median and min-max spread of each measure, and its usual findings."""
    rows = []
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm.name]
        if not mine:
            continue
        row: dict[str, object] = {"arm": arm.name, "runs": len(mine)}
        for key in (
            "throughput_rps",
            "latency_p50_ms",
            "latency_p99_ms",
            "front_cpu_pct",
            "scheduler_cpu_pct",
            "errors",
        ):
            values = [float(r["load"][key]) for r in mine]
            row[key] = statistics.median(values)
            row[f"{key}_min"], row[f"{key}_max"] = min(values), max(values)
        findings = [r.get("top_finding") or "none" for r in mine]
        row["top_finding"] = max(set(findings), key=findings.count)
        sets = [
            ", ".join(f"{f['id']} ({f['severity']})" for f in r.get("findings", [])) or "none"
            for r in mine
        ]
        row["findings"] = max(set(sets), key=sets.count)
        rows.append(row)
    return rows


def markdown(rows: list[dict], config: Config) -> str:
    quota = f"{config.quota_cores:g}-core quota" if config.quota_cores else "no quota"
    lines = [
        f"Front in a {quota}, concurrency {config.concurrency}, {config.requests} requests"
        f" per run, {config.repeats} runs per arm; medians [min-max].",
        "",
        "| arm | throughput req/s | p50 ms | p99 ms | front CPU % | scheduler CPU % | "
        "errors | profkit findings (most runs) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(row: dict, key: str, digits: int = 1) -> str:
        return (
            f"{row[key]:.{digits}f} [{row[f'{key}_min']:.{digits}f}-{row[f'{key}_max']:.{digits}f}]"
        )

    for row in rows:
        lines.append(
            f"| {row['arm']} | {cell(row, 'throughput_rps')} | "
            f"{cell(row, 'latency_p50_ms', 0)} | {cell(row, 'latency_p99_ms', 0)} | "
            f"{cell(row, 'front_cpu_pct', 0)} | {cell(row, 'scheduler_cpu_pct', 0)} | "
            f"{row['errors']:.0f} | "
            f"{row['findings']} |"
        )
    base = next((r for r in rows if r["arm"] == rows[0]["arm"]), None)
    if base and len(rows) > 1:
        lines.append("")
        for row in rows[1:]:
            ratio = (
                row["throughput_rps"] / base["throughput_rps"]
                if base["throughput_rps"]
                else float("nan")
            )
            low = (
                row["throughput_rps_min"] / base["throughput_rps_max"]
                if base["throughput_rps_max"]
                else float("nan")
            )
            high = (
                row["throughput_rps_max"] / base["throughput_rps_min"]
                if base["throughput_rps_min"]
                else float("nan")
            )
            lines.append(
                f"- {row['arm']} vs {base['arm']}: {ratio:.2f}x throughput "
                f"(spread {low:.2f}-{high:.2f}x)"
            )
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_front(arm: Arm, config: Config, port: int, group: QuotaGroup | None) -> subprocess.Popen:
    command = [
        sys.executable,
        "-u",
        "-m",
        "recipes.mm_serving.front",
        "--transport",
        arm.transport,
        "--port",
        str(port),
        "--model-size",
        str(config.model_size),
    ]
    if arm.threads == "auto":
        command.append("--autothreads")
    elif arm.threads != "default":
        command += ["--threads", str(int(arm.threads))]
    front = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=join_quota(group)
    )
    assert front.stdout is not None
    line = front.stdout.readline()
    if not line.startswith("ready"):
        front.kill()
        raise RuntimeError(f"front did not start: {line!r}")
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{url}/info", timeout=2).read()
            return front
        time.sleep(0.05)
    raise RuntimeError("front never answered")


def stop(process: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait_s)


def one_run(arm: Arm, round_index: int, config: Config, out: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        group: QuotaGroup | None = None
        if config.quota_cores:
            with contextlib.suppress(CgroupError):
                group = stack.enter_context(quota_group(config.quota_cores))
        front = start_front(arm, config, port, group)
        try:
            asyncio.run(run_load(url, config.concurrency, config.warmup, 10_000, config.image_size))
            measured, _ = asyncio.run(
                run_load(url, config.concurrency, config.requests, config.seed, config.image_size)
            )
            bundle = out / "bundles" / f"{arm.name.split(':')[0].strip()}-{round_index}"
            finding = profile(front.pid, url, config, bundle)
        finally:
            stop(front)
    return {
        "arm": arm.name,
        "round": round_index,
        "arm_config": asdict(arm),
        "load": asdict(measured),
        **finding,
    }


def profile(pid: int, url: str, config: Config, bundle: Path) -> dict:
    """profkit attached to the front while a second load runs; its top finding."""
    command = attach_command(
        pid,
        duration=config.profile_seconds,
        out=bundle,
        report=False,
        collectors=config.profile_collectors or None,
    )
    attach = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + config.profile_seconds + 30
    while attach.poll() is None and time.monotonic() < deadline:
        asyncio.run(
            run_load(url, config.concurrency, config.concurrency * 2, 20_000, config.image_size)
        )
    attach.wait(timeout=120)
    report = subprocess.run(
        [sys.executable, "-m", "profkit", "report", str(bundle), "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if report.returncode != 0:
        return {"top_finding": None, "profkit_error": report.stderr.strip()[-300:]}
    data = json.loads(report.stdout)
    findings = data["findings"]
    return {
        "top_finding": findings[0]["id"] if findings else None,
        "findings": [{k: f[k] for k in ("id", "severity", "summary", "fix")} for f in findings],
        "bundle": str(bundle),
    }


def reanalyse(path: Path, config: Config) -> int:
    """Findings come from the saved bundles: a newer analysis can be applied to old runs."""
    data = json.loads(path.read_text())
    for run in data["runs"]:
        bundle = run.get("bundle")
        if not bundle or not Path(bundle).exists():
            continue
        report = subprocess.run(
            [sys.executable, "-m", "profkit", "report", bundle, "--format", "json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        findings = json.loads(report.stdout)["findings"] if report.returncode == 0 else []
        run["top_finding"] = findings[0]["id"] if findings else None
        run["findings"] = [
            {k: f[k] for k in ("id", "severity", "summary", "fix")} for f in findings
        ]
    data["summary"] = summarise(data["runs"], config.arms)
    path.write_text(json.dumps(data, indent=2))
    table = markdown(data["summary"], config)
    path.with_suffix(".md").write_text(table)
    print(table, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("experiment-results"))
    parser.add_argument(
        "--table-from", type=Path, help="only re-render the table of an earlier experiment.json"
    )
    parser.add_argument(
        "--reanalyse",
        type=Path,
        help="re-run profkit report on the saved bundles of an experiment.json "
        "and rewrite its findings and table",
    )
    args = parser.parse_args(argv)
    config = Config.load(args.config)
    if args.table_from:
        runs = json.loads(args.table_from.read_text())["runs"]
        print(markdown(summarise(runs, config.arms), config), end="")
        return 0
    if args.reanalyse:
        return reanalyse(args.reanalyse, config)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for round_index, arm in plan(config.arms, config.repeats, config.seed):
        run = one_run(arm, round_index, config, args.out)
        runs.append(run)
        # Written after every run, so that an interrupted experiment keeps what it measured.
        (args.out / "experiment.partial.json").write_text(json.dumps(runs, indent=2))
        load = run["load"]
        print(
            f"round {round_index + 1} {arm.name}: {load['throughput_rps']:.1f} req/s, p50 "
            f"{load['latency_p50_ms']:.0f} ms, front CPU {load['front_cpu_pct']:.0f}%, "
            f"finding {run.get('top_finding')}",
            flush=True,
        )
    rows = summarise(runs, config.arms)
    table = markdown(rows, config)
    (args.out / "experiment.json").write_text(
        json.dumps({"config": asdict(config), "runs": runs, "summary": rows}, indent=2)
    )
    (args.out / "experiment.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
