"""The case study's hot path as a runnable process.

Each iteration copies a tensor into a fresh POSIX shared-memory segment, as a multimodal front end
does per request. `--copy torch` goes through `Tensor.copy_()`, which ATen splits across its
intra-op OpenMP pool; `--copy numpy` writes the bytes through a numpy view, never the pool.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing import shared_memory

import numpy as np
import torch


def copy_with_torch(source: torch.Tensor, shm: shared_memory.SharedMemory) -> None:
    destination = torch.frombuffer(shm.buf, dtype=torch.uint8)
    destination.copy_(source.view(torch.uint8).reshape(-1))  # fanout: ATen's parallel copy
    del destination


def copy_with_numpy(source: torch.Tensor, shm: shared_memory.SharedMemory) -> None:
    view = np.ndarray((source.numel() * source.element_size(),), dtype=np.uint8, buffer=shm.buf)
    view[:] = source.view(torch.uint8).reshape(-1).numpy()  # single thread, no intra-op pool
    del view


COPIES = {"torch": copy_with_torch, "numpy": copy_with_numpy}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copy", choices=sorted(COPIES), default="torch")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: keep)")
    parser.add_argument("--tensor-mb", type=float, default=12.0)
    parser.add_argument("--duration", type=float, default=0.0, help="seconds; 0 runs until signal")
    parser.add_argument("--report-every", type=float, default=0.0, help="print progress every N s")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="sleep between copies")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="copy into one shared-memory segment every time, not a fresh one per copy (a "
        "flood of small regions: creating a segment costs more than a small copy)",
    )
    parser.add_argument(
        "--depth", type=int, default=0, help="run the copy loop this many Python frames deeper"
    )
    return parser.parse_args(argv)


def deeper(depth: int, call: Callable[[], int]) -> int:
    """call() from `depth` frames down: a dispatcher as deep as a model's code puts it."""
    if depth > 0:
        return deeper(depth - 1, call)
    return call()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    nbytes = int(args.tensor_mb * 1024 * 1024)
    source = torch.rand(nbytes // 4, dtype=torch.float32)
    copy = COPIES[args.copy]
    stop = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    print(
        f"shm_fanout pid={os.getpid()} copy={args.copy} threads={torch.get_num_threads()} "
        f"tensor_mb={args.tensor_mb}",
        flush=True,
    )
    started = time.monotonic()
    deadline = started + args.duration if args.duration > 0 else float("inf")
    kept = shared_memory.SharedMemory(create=True, size=source.numel() * 4) if args.reuse else None

    def loop() -> int:
        copies = 0
        last_report = started
        while not stop and time.monotonic() < deadline:
            if kept is not None:
                copy(source, kept)
            else:
                shm = shared_memory.SharedMemory(create=True, size=source.numel() * 4)
                try:
                    copy(source, shm)
                finally:
                    shm.close()
                    shm.unlink()
            copies += 1
            if args.pause_ms:
                time.sleep(args.pause_ms / 1000)
            now = time.monotonic()
            if args.report_every and now - last_report >= args.report_every:
                print(f"progress copies={copies} t_ns={time.monotonic_ns()}", flush=True)
                last_report = now
        return copies

    copies = deeper(args.depth, loop)
    if kept is not None:
        kept.close()
        kept.unlink()
    elapsed = time.monotonic() - started
    print(f"copies={copies} elapsed={elapsed:.3f} copies_per_s={copies / elapsed:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
