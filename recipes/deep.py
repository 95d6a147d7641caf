"""Deep Python stacks: a model of nested modules whose innermost one fans a copy out to torch's
OpenMP pool, and threads named through `threading` that recurse deep and then burn CPU there.

    python recipes/deep.py [--modules 16] [--recurse 120] [--named 2] [--threads 4] [--mb 1]

Each nn.Module call is three Python frames (_wrapped_call_impl, _call_impl, forward), so 16
nested modules put the copy about 50 frames below the script's `<module>`. `--named N` starts N
threads, "deep-thread" and "cls-thread" first, each recursing `--recurse` frames deep before it
spins in pure Python (its own frames on the CPU, no pool). Prints one "ready" line, with the
line that calls the model (`call_line`), then runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

NAMES = ("deep-thread", "cls-thread")


def spin_at(depth: int, stop: threading.Event) -> None:
    """Recurse `depth` frames, then spin in Python until stopped."""
    if depth > 0:
        spin_at(depth - 1, stop)
        return
    total = 0
    while not stop.is_set():
        for i in range(2000):
            total += i * i


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=16)
    parser.add_argument("--recurse", type=int, default=120)
    parser.add_argument("--named", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--mb", type=float, default=1.0)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)

    class Leaf(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.source = torch.ones(int(args.mb * (1 << 20)) // 4)

        def forward(self, into: torch.Tensor) -> torch.Tensor:
            return into.copy_(self.source)  # the pool's work, 3 x modules frames down

    class Nest(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, into: torch.Tensor) -> torch.Tensor:
            return self.inner(into)

    model: torch.nn.Module = Leaf()
    for _ in range(args.modules - 1):
        model = Nest(model)
    into = torch.empty(int(args.mb * (1 << 20)) // 4)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    names = [*NAMES, *(f"named-{i}" for i in range(len(NAMES), args.named))][: args.named]
    for name in names:
        threading.Thread(target=spin_at, args=(args.recurse, stop), name=name).start()
    call_line = sys._getframe().f_lineno + 4
    print(f"ready deep pid={os.getpid()} call_line={call_line}", flush=True)
    with torch.inference_mode():
        while not stop.is_set():
            model(into)  # the program's own line that leads to the pool
    return 0


if __name__ == "__main__":
    sys.exit(main())
