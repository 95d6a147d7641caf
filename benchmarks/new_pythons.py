"""CPython 3.14 and 3.15 as Debian builds them (scripts/fetch_cpython.sh puts them in
.cache/cpython): for each, a capture of numpy's OpenBLAS pool and one of libgomp called through
ctypes 150 frames down, at default settings, and what the report says of them.

    python -m benchmarks.new_pythons --captures 2

Runs as root. Prints each capture's walker record (version, build, where the layout came
from), the OpenBLAS pool's regions with a stack and its CPU at the three sites' lines, the
OpenMP pool's regions by site (the recipe dispatches 1:2:3), and the shortest pool stack.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from profkit.bundle.read import load_bundle
from recipes.launch import attach_args

from .common import report_json
from .deep_stacks import pool_stacks, reaches_root

ROOT = Path(__file__).resolve().parent.parent
SITES = ("site_one", "site_two", "site_three")
CASES = {
    "openblas": (("--pool", "blas", "--rounds-per-s", "10"), {"OPENBLAS_NUM_THREADS": "2"}),
    "openmp": (("--pool", "gomp", "--threads", "2", "--rounds-per-s", "40", "--depth", "150"), {}),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="3.14,3.15")
    parser.add_argument("--captures", type=int, default=2)
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args(argv)
    lines = _site_lines()
    for version in args.versions.split(","):
        python = ROOT / ".cache" / "cpython" / version / "run"
        if not python.exists():
            print(f"## {version}: {python} is missing (scripts/setup.sh --test fetches it)")
            continue
        for case, (recipe_args, env) in CASES.items():
            recipe = subprocess.Popen(
                [str(python), "-u", str(ROOT / "recipes" / "sites.py"), *recipe_args],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env={**os.environ, **env},
            )
            try:
                assert recipe.stdout is not None
                print(f"## {version}, {case}: {recipe.stdout.readline().strip()}", flush=True)
                time.sleep(1.0)
                for capture in range(args.captures):
                    print(f"capture {capture}: {_capture(recipe.pid, case, lines, args.duration)}")
            finally:
                recipe.terminate()
                recipe.wait(timeout=30)
    return 0


def _capture(pid: int, case: str, lines: dict[str, int], duration: float) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "b"
        attached = subprocess.run(
            [sys.executable, "-m", "profkit", *attach_args(pid, duration=duration, out=out)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if attached.returncode != 0:
            return f"exit {attached.returncode}: {attached.stderr.strip()}"
        python = json.loads((out / "ebpf.json").read_text())["python"]
        walker = (
            f"walker {python['walker']} ({python.get('full_version')}, {python.get('build')}, "
            f"layout from {python.get('layout')}), stacks cut {python['counts'].get('truncated')}"
        )
        fallback = "py-spy samples the Python stacks" in attached.stderr
        report = report_json(out)
        runtime = "openblas" if case == "openblas" else "openmp"
        pool = next(p for p in report["pools"] if p["runtime"] == runtime)
        rows = [r for r in report["attribution"] if r["pool"] == runtime]
        at_lines = sum(
            r["share"]
            for r in rows
            if any(r["site"].endswith(f"recipes/sites.py:{line}") for line in lines.values())
        )
        found = (
            f"{walker}; fallback note {fallback}; regions {pool['regions']}, with a stack "
            f"{pool['regions_with_stack'] / max(1, pool['regions']):.3f}; CPU at the sites' "
            f"lines {at_lines:.3f}"
        )
        if case == "openmp":
            by_site = {r["function"]: r["regions"] for r in rows}
            stacks = pool_stacks(load_bundle(out))
            rooted = sum(reaches_root(s, "recipes/sites.py") for s in stacks)
            found += (
                f"; regions by site {[by_site.get(s, 0) for s in SITES]}; stacks reaching "
                f"<module> {rooted}/{len(stacks)}, shortest {min(map(len, stacks), default=0)}"
            )
        return found


def _site_lines() -> dict[str, int]:
    text = (ROOT / "recipes" / "sites.py").read_text().splitlines()
    return {
        site: next(i for i, t in enumerate(text, 1) if "# " + site.replace("_", " ") in t)
        for site in SITES
    }


if __name__ == "__main__":
    sys.exit(main())
