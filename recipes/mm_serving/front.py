"""The front process: HTTP in, torch preprocessing, pixel_values to the scheduler.

    python -m recipes.mm_serving.front --transport shm-torch --port 8000

`--transport shm-torch` copies into a fresh POSIX shared-memory segment with Tensor.copy_(),
which ATen fans out to its intra-op pool; `shm-numpy` writes the same bytes through a numpy
view; `cuda-ipc` (with a GPU) keeps pixel_values on the device and sends an IPC handle.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
import threading
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import torch
from aiohttp import web

from .model import decode_ppm, preprocess
from .scheduler import run as run_scheduler

TRANSPORTS = ("shm-torch", "shm-numpy", "cuda-ipc")


def to_shared_memory(pixel_values: torch.Tensor, with_torch: bool) -> str:
    nbytes = pixel_values.numel() * pixel_values.element_size()
    shm = shared_memory.SharedMemory(create=True, size=nbytes, name=segment_name())
    try:
        if with_torch:
            destination = torch.frombuffer(shm.buf, dtype=torch.uint8)
            destination.copy_(pixel_values.view(torch.uint8).reshape(-1))  # the pool fans out
            del destination
        else:
            view = np.ndarray((nbytes,), dtype=np.uint8, buffer=shm.buf)
            view[:] = pixel_values.numpy().view(np.uint8).reshape(-1)  # one thread, no pool
            del view
        # The scheduler unlinks the segment; this process must not clean it up at exit.
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        return shm.name
    finally:
        shm.close()


def segment_name() -> str:
    """A fresh segment's name, which says which front made it: a segment left behind is told
    from another process's."""
    return f"psm_{os.getpid()}_{os.urandom(4).hex()}"


class Front:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = "cuda" if args.transport == "cuda-ipc" else "cpu"
        context = torch.multiprocessing.get_context("spawn")
        self.requests = context.Queue()
        self.responses = context.Queue()
        self.scheduler = context.Process(
            target=run_scheduler,
            daemon=True,
            args=(self.requests, self.responses, args.scheduler_threads, self.device),
        )
        self.pending: dict[int, tuple[asyncio.Future, object]] = {}
        self.ids = itertools.count()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.scheduler_pid = 0

    def start_scheduler(self) -> None:
        self.scheduler.start()
        kind, pid, _ = self.responses.get(timeout=120)
        assert kind == "ready"
        self.scheduler_pid = pid
        threading.Thread(target=self._read_responses, daemon=True).start()

    def _read_responses(self) -> None:
        while True:
            request_id, result, error = self.responses.get()
            entry = self.pending.pop(request_id, None)
            if entry is not None and self.loop is not None:
                future = entry[0]
                self.loop.call_soon_threadsafe(_settle, future, result, error)

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            image = decode_ppm(body)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        pixel_values = preprocess(image, self.args.model_size)
        request_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        if self.args.transport == "cuda-ipc":
            payload: object = pixel_values.to(self.device)
            keep: object = payload  # the producer keeps an IPC tensor alive until it is used
        else:
            name = to_shared_memory(pixel_values, self.args.transport == "shm-torch")
            payload, keep = (name, tuple(pixel_values.shape)), None
        self.pending[request_id] = (future, keep)
        self.requests.put((request_id, self.args.transport, payload))
        result = await future
        return web.json_response({"id": request_id, "result": result})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "front_pid": os.getpid(),
                "scheduler_pid": self.scheduler_pid,
                "transport": self.args.transport,
                "front_threads": torch.get_num_threads(),
            }
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/info", self.info)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.loop = asyncio.get_running_loop()

    async def _on_cleanup(self, app: web.Application) -> None:
        self.requests.put(None)
        self.scheduler.join(timeout=10)
        if self.scheduler.is_alive():
            self.scheduler.kill()


def _settle(future: asyncio.Future, result: object, error: str | None) -> None:
    if future.done():
        return
    if error:
        future.set_exception(RuntimeError(error))
    else:
        future.set_result(result)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=TRANSPORTS, default="shm-torch")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-size", type=int, default=448, help="resize target in pixels")
    parser.add_argument("--threads", type=int, default=0, help="front torch threads (0: keep)")
    parser.add_argument(
        "--autothreads",
        action="store_true",
        help="size the front's pools from its cgroup quota (profkit.autothreads)",
    )
    parser.add_argument("--scheduler-threads", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.transport == "cuda-ipc" and not torch.cuda.is_available():
        print("front: cuda-ipc needs a GPU", file=sys.stderr)
        return 2
    if args.autothreads:
        from profkit.autothreads import apply

        apply()
    elif args.threads > 0:
        torch.set_num_threads(args.threads)
    front = Front(args)
    front.start_scheduler()
    print(
        f"ready mm_serving front pid={os.getpid()} scheduler={front.scheduler_pid} "
        f"transport={args.transport} threads={torch.get_num_threads()} port={args.port}",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    web.run_app(front.app(), host=args.host, port=args.port, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
