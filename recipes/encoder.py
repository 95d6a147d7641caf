"""Sentence embeddings on the CPU, as a serving front encodes requests: a MiniLM-shaped BERT
encoder from Hugging Face transformers (6 layers, hidden size 384, 12 heads) run in a loop
over small batches of token ids, mean-pooled.

The weights are random: the model is built from its configuration, so nothing is downloaded,
and the ops (embedding, linear layers through sgemm, softmax attention, layer norm, GELU) are
those of the trained model, dispatched by transformers' and torch.nn's own code to torch's
OpenMP pool. Small batches start tens of thousands of parallel regions a second.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time


def build(threads: int):  # torch is imported here, after the thread count is set
    # Nothing to fetch and nothing to say before the "ready" line.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    from transformers import BertConfig, BertModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )
    return torch, BertModel(config).eval()


def encode(torch, model, ids, mask):
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)  # mean pooling


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="sentences per batch")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per sentence")
    args = parser.parse_args(argv)
    torch, model = build(args.threads)
    ids = torch.randint(0, 30522, (args.batch, args.tokens))
    mask = torch.ones_like(ids)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    encode(torch, model, ids, mask)  # the first call allocates and warms the pool
    print(f"ready encoder pid={os.getpid()} threads={args.threads}", flush=True)
    batches, started = 0, time.monotonic()
    while not stop.is_set():
        encode(torch, model, ids, mask)
        batches += 1
    print(f"batches={batches} per_s={batches / (time.monotonic() - started):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
