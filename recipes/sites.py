"""Three call sites that dispatch parallel regions in a known 1:2:3 ratio.

Each round dispatches one region from `site_one`, two from `site_two` and three from
`site_three` (the last through two helper frames), each region the same work. A profiler that
names call sites must find them in that ratio.

--pool torch: the region is `destination.copy_(source)` on torch's OpenMP pool.
--pool gomp: the region is a bare GOMP_parallel(free, NULL, threads) through ctypes on torch's
libgomp (or the system's), with no import but the standard library, so that the recipe runs
under any CPython.
--pool gomp-system: as gomp, on the system's libgomp (Debian's libgomp1), whose code has another
shape than torch's copy.
--pool gomp2: as gomp, but `site_three` dispatches through a second copy of libgomp (a copy of
the file under another name, as a package that bundles its own runtime brings one), so the
process maps two copies and both run regions.
--pool blas: the region is a 400x400 matrix product on numpy's bundled OpenBLAS pool.
--thread: the rounds run on a second Python thread, not the main one.
--depth N: the rounds run N Python frames deeper than main (a deep stack the walker must read
whole).
--shuffle: each round's six regions run in a fresh random order. Paced rounds start after a
pause, and the first region of a round wakes workers that slept through it, a cost the other
regions do not pay; in order, that cost would always fall on site_one. Shuffled, it falls on
each site in proportion to its regions, so that every region costs the same on average and the
pool's CPU splits 1:2:3 as the regions do.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import ctypes.util
import functools
import glob
import importlib.util
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time


def site_one(dispatch):
    dispatch[0]()  # site one


def site_two(dispatch):
    dispatch[0]()  # site two


def site_three(dispatch):
    dispatch[-1]()  # site three


def helper_inner(dispatch):
    site_three(dispatch)  # helper inner


def helper_outer(dispatch):
    helper_inner(dispatch)  # helper outer


def one_round(dispatch):
    site_one(dispatch)
    for _ in range(2):
        site_two(dispatch)
    for _ in range(3):
        helper_outer(dispatch)


SHUFFLE = random.Random(0)


def shuffled_round(dispatch):
    sites = [site_one, site_two, site_two, helper_outer, helper_outer, helper_outer]
    for site in SHUFFLE.sample(sites, len(sites)):
        site(dispatch)


def gomp_library(system=False):
    """torch's bundled libgomp where this project's environment has it, else the system's."""
    if system:
        return system_gomp()
    spec = importlib.util.find_spec("torch")  # found, not imported: torch would start its pool
    places = (
        [os.path.join(where, "lib") for where in (spec.submodule_search_locations or [])]
        if spec
        else []
    )
    # Run by another interpreter (the walker's version tests), torch is this checkout's.
    here = os.path.dirname(os.path.abspath(__file__))
    places.append(
        os.path.join(here, "..", ".venv", "lib", "python3*", "site-packages", "torch", "lib")
    )
    for place in places:
        for lib in sorted(glob.glob(os.path.join(place, "libgomp*.so*"))):
            return lib
    return system_gomp()


def system_gomp():
    name = ctypes.util.find_library("gomp")  # a soname: the path is where the loader put it
    if name is None:
        return None
    ctypes.CDLL(name)
    with open("/proc/self/maps") as maps:
        return next((line.split()[-1] for line in maps if name in line), None)


def gomp_dispatch(path, threads):
    gomp = ctypes.CDLL(path)
    libc = ctypes.CDLL(None)
    # free(NULL) on every team thread: a real region whose body does nothing.
    body = ctypes.cast(libc.free, ctypes.c_void_p)
    gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    gomp.GOMP_parallel.restype = None
    return functools.partial(gomp.GOMP_parallel, body, None, threads, 0)


def second_copy(path):
    """The same library under another file name in a fresh directory, removed at exit."""
    directory = tempfile.mkdtemp(prefix="sites-")
    copy = os.path.join(directory, "libgomp-copy.so.1")
    shutil.copyfile(path, copy)
    atexit.register(shutil.rmtree, directory, True)
    return copy


def make_dispatch(pool, threads, megabytes):
    """The callables the sites run: one, or two where site_three uses a second runtime copy."""
    if pool == "torch":
        import torch

        torch.set_num_threads(threads)
        source = torch.randint(0, 255, (int(megabytes * 1024 * 1024),), dtype=torch.uint8)
        destination = torch.empty_like(source)
        return [functools.partial(destination.copy_, source)]
    if pool == "blas":
        import numpy

        left, right = numpy.random.rand(400, 400), numpy.random.rand(400, 400)
        return [functools.partial(numpy.matmul, left, right)]
    path = gomp_library(system=pool == "gomp-system")
    if not path:
        raise SystemExit("no libgomp found")
    dispatch = [gomp_dispatch(path, threads)]
    if pool == "gomp2":
        dispatch.append(gomp_dispatch(second_copy(path), threads))
    return dispatch


def run(dispatch, stop, rounds_per_s, counter, shuffle=False):
    # Paced to a schedule, not by a fixed sleep after each round: the rate holds whatever a
    # round costs, up to what the machine can run.
    pause = 1.0 / rounds_per_s if rounds_per_s > 0 else 0.0
    due = time.monotonic()
    a_round = shuffled_round if shuffle else one_round
    while not stop.is_set():
        a_round(dispatch)
        counter[0] += 1
        if pause:
            due = max(due + pause, time.monotonic() - 0.1)  # a stall is not made up in a burst
            time.sleep(max(0.0, due - time.monotonic()))


def deeper(depth, call):
    """call() from `depth` frames down."""
    if depth > 0:
        return deeper(depth - 1, call)
    return call()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pool", choices=["torch", "gomp", "gomp-system", "gomp2", "blas"], default="torch"
    )
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--mb", type=float, default=48.0, help="copy size (--pool torch)")
    parser.add_argument("--rounds-per-s", type=float, default=0.0, help="0: as fast as it can")
    parser.add_argument("--thread", action="store_true", help="dispatch from a second thread")
    parser.add_argument("--shuffle", action="store_true", help="each round in a random order")
    parser.add_argument("--depth", type=int, default=0, help="frames deeper than main")
    args = parser.parse_args(argv)
    dispatch = make_dispatch(args.pool, args.threads, args.mb)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    counter = [0]
    version = ".".join(map(str, sys.version_info[:2]))
    print(f"ready sites pid={os.getpid()} pool={args.pool} python={version}", flush=True)
    if args.thread:
        worker = threading.Thread(
            target=run,
            args=(dispatch, stop, args.rounds_per_s, counter, args.shuffle),
            name="dispatcher",
        )
        worker.start()
        while worker.is_alive():
            worker.join(0.2)  # main waits
    elif args.depth:
        deeper(args.depth, lambda: run(dispatch, stop, args.rounds_per_s, counter, args.shuffle))
    else:
        run(dispatch, stop, args.rounds_per_s, counter, args.shuffle)
    print(f"rounds={counter[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
