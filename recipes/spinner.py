"""A thread that stands at one line: the main thread nests `--depth` calls, then spins in pure
Python on one line until SIGINT or SIGTERM. Any Python will do (no import but the standard
library): the walker's version tests compare its lines with py-spy's.

    python recipes/spinner.py [--depth 40]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

stop: list[int] = []


def nest(depth):
    if depth > 0:
        return nest(depth - 1)  # nest
    return spin()


def spin():
    # Inside sum() nearly all the time: the thread stands at this one line for any reader.
    total = 0
    while not stop:
        total += sum(range(2_000_000))  # spin
    return total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=40)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    version = ".".join(map(str, sys.version_info[:2]))
    print(f"ready spinner pid={os.getpid()} python={version}", flush=True)
    nest(args.depth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
