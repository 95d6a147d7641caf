"""Sentence embeddings on the CPU, as a serving front encodes requests: a MiniLM-shaped BERT
encoder (6 layers, hidden size 384, 12 heads) encoding small batches in a loop.

`--library sentence-transformers` (the default) runs it as sentence-transformers does for a
user: a SentenceTransformer of a Transformer module and mean pooling, `encode()` on a list of
sentences, its tokenizer included; `--library transformers` calls the BertModel directly on
token ids and pools by hand.

The weights are random: the model is built from MiniLM's configuration and saved to a
temporary directory (its WordPiece vocabulary generated), so nothing is downloaded, and the ops
(embedding, linear layers through sgemm, softmax attention, layer norm, GELU) are those of the
trained model, dispatched by the libraries' own code to torch's OpenMP pool. Small batches
start tens of thousands of parallel regions a second.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB = 30522
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def bert_config() -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )


def words(count: int, seed: int = 0) -> list[str]:
    """Distinct lowercase words, as a WordPiece vocabulary and the sentences' text."""
    rng = random.Random(seed)
    seen: set[str] = set()
    while len(seen) < count:
        seen.add(
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
        )
    return sorted(seen)


def save_model(directory: Path) -> list[str]:
    """A MiniLM-shaped BertModel and its tokenizer in `directory`; the vocabulary's words."""
    from transformers import BertModel, BertTokenizer

    vocab = words(VOCAB - len(SPECIAL))
    (directory / "vocab.txt").write_text("\n".join(SPECIAL + vocab) + "\n")
    BertTokenizer(vocab_file=str(directory / "vocab.txt")).save_pretrained(directory)
    BertModel(bert_config()).save_pretrained(directory)
    return vocab


def sentence_transformers(batch: int, tokens: int, directory: Path) -> Callable[[], object]:
    import torch
    from sentence_transformers import SentenceTransformer

    try:  # where the modules live from sentence-transformers 6
        modules: Any = importlib.import_module("sentence_transformers.sentence_transformer.modules")
    except ImportError:
        modules = importlib.import_module("sentence_transformers.models")
    Pooling, Transformer = modules.Pooling, modules.Transformer

    vocab = save_model(directory)
    word = Transformer(str(directory), max_seq_length=tokens + 2)
    size = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    model = SentenceTransformer(modules=[word, Pooling(size(), "mean")], device="cpu")
    rng = random.Random(1)
    sentences = [" ".join(rng.choice(vocab) for _ in range(tokens)) for _ in range(batch)]

    def encode() -> object:
        with torch.inference_mode():
            return model.encode(
                sentences, batch_size=batch, convert_to_tensor=True, show_progress_bar=False
            )

    return encode


def transformers(batch: int, tokens: int) -> Callable[[], object]:
    import torch
    from transformers import BertModel

    model = BertModel(bert_config()).eval()
    ids = torch.randint(0, VOCAB, (batch, tokens))
    mask = torch.ones_like(ids)

    def encode() -> object:
        with torch.inference_mode():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)

    return encode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library",
        choices=["sentence-transformers", "transformers"],
        default="sentence-transformers",
    )
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="sentences per batch")
    parser.add_argument("--tokens", type=int, default=16, help="words per sentence")
    parser.add_argument("--report-every", type=float, default=0.0, help="print progress every N s")
    args = parser.parse_args(argv)
    # Nothing to fetch and nothing to say before the "ready" line; torch is imported after the
    # thread count is set.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    from transformers.utils import logging

    logging.disable_progress_bar()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="encoder-") as directory:
        if args.library == "sentence-transformers":
            encode = sentence_transformers(args.batch, args.tokens, Path(directory))
        else:
            encode = transformers(args.batch, args.tokens)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        encode()  # the first call allocates and warms the pool
        print(f"ready encoder pid={os.getpid()} threads={args.threads}", flush=True)
        batches, started = 0, time.monotonic()
        last_report = started
        while not stop.is_set():
            encode()
            batches += 1
            now = time.monotonic()
            if args.report_every and now - last_report >= args.report_every:
                print(f"progress done={batches} t_ns={time.monotonic_ns()}", flush=True)
                last_report = now
    print(f"batches={batches} per_s={batches / (time.monotonic() - started):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
