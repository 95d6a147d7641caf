"""Two call sites running the same op: one fans out to the intra-op pool, one does not.

Each iteration copies a tensor into a fresh shared-memory segment twice: first with the full
pool (`copy_fanout`), then under torch.set_num_threads(1) (`copy_single`). A profiler must
attribute the pool's CPU to the first site only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from multiprocessing import shared_memory

import torch


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def copy_fanout(source: torch.Tensor) -> None:
    shm = shared_memory.SharedMemory(create=True, size=source.numel())
    try:
        torch.frombuffer(shm.buf, dtype=torch.uint8).copy_(source)
    finally:
        shm.close()
        shm.unlink()


def copy_single(source: torch.Tensor) -> None:
    shm = shared_memory.SharedMemory(create=True, size=source.numel())
    try:
        with single_thread():
            torch.frombuffer(shm.buf, dtype=torch.uint8).copy_(source)
    finally:
        shm.close()
        shm.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--tensor-mb", type=float, default=8.0)
    parser.add_argument("--duration", type=float, default=0.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    source = torch.randint(0, 255, (int(args.tensor_mb * 1024 * 1024),), dtype=torch.uint8)
    stop = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    print(f"ready two_sites pid={os.getpid()} threads={torch.get_num_threads()}", flush=True)
    deadline = time.monotonic() + args.duration if args.duration > 0 else float("inf")
    rounds = 0
    while not stop and time.monotonic() < deadline:
        copy_fanout(source)
        copy_single(source)
        rounds += 1
    print(f"rounds={rounds}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
