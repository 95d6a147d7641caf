"""The scheduler process: maps each request's pixel_values and runs the vision step."""

from __future__ import annotations

import os
import sys
import traceback
from multiprocessing import shared_memory
from multiprocessing.queues import Queue
from typing import Any

import torch

from .model import VisionStep, summary


def run(requests: Queue[Any], responses: Queue[Any], threads: int, device: str) -> None:
    torch.set_num_threads(threads)
    model = VisionStep().to(device)
    responses.put(("ready", os.getpid(), None))
    while True:
        message = requests.get()
        if message is None:
            return
        request_id, transport, payload = message
        try:
            if transport == "cuda-ipc":
                pixel_values = payload  # a CUDA tensor received through CUDA IPC
            else:
                name, shape = payload
                shm = shared_memory.SharedMemory(name=name)
                try:
                    count = shape[0] * shape[1]
                    flat = torch.frombuffer(shm.buf, dtype=torch.float32, count=count)
                    pixel_values = flat.view(*shape).to(device, copy=True)
                    del flat
                finally:
                    shm.close()
                    shm.unlink()
            responses.put((request_id, summary(model(pixel_values)), None))
        except Exception as exc:  # answered as an error, the scheduler keeps serving
            traceback.print_exc(file=sys.stderr)
            responses.put((request_id, None, f"{type(exc).__name__}: {exc}"))
