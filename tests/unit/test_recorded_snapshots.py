"""Every output of every recorded bundle, byte for byte against the snapshot taken when it was
last meant to change: a refactor must not change what a saved bundle reports.

The snapshot holds a SHA-256 per output (tests/data/snapshots.json). When a change is meant to
change an output, render both trees with scripts/recorded_reports.sh, read the diff, then
write the new digests with `python -m tests.unit.test_recorded_snapshots --update`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from profkit.cli import run

from ..support import DATA

SNAPSHOTS = DATA / "snapshots.json"
BUNDLES = sorted(p.name for p in DATA.iterdir() if (p / "manifest.json").exists())
VIEWS = ("merged", "python", "workers", "offcpu")
# Reports name their bundle's path: render copies at one fixed place.
COPIES = Path("/tmp/profkit-recorded-bundles")


def outputs() -> Iterator[tuple[str, list[str]]]:
    """(output name, profkit arguments with {bundle} and {out}), as recorded_reports.sh."""
    for fmt in ("text", "json", "html"):
        yield f"report.{fmt}", ["report", "{bundle}", "--format", fmt, "-o", "{out}"]
    for view in VIEWS:
        yield f"flame.{view}.svg", ["flame", "{bundle}", "--view", view, "-o", "{out}"]
        for fmt in ("folded", "speedscope", "pprof", "pstats"):
            yield (
                f"{view}.{fmt}",
                ["export", "{bundle}", "--view", view, "--format", fmt, "-o", "{out}"],
            )
    yield "timeline.json", ["timeline", "{bundle}", "-o", "{out}"]


def digest(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".pprof"):
        data = gzip.decompress(data)  # the gzip header carries a time
    return hashlib.sha256(data).hexdigest()


def render(name: str, work: Path) -> dict[str, str]:
    bundle = COPIES / name
    if bundle.exists():
        shutil.rmtree(bundle)
    shutil.copytree(DATA / name, bundle)
    digests = {}
    for output, args in outputs():
        out = work / f"{name}.{output}"
        argv = [a.format(bundle=bundle, out=out) for a in args]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = run(argv)
        assert code == 0, (output, code)
        digests[f"{name}.{output}"] = digest(out)
    return digests


@pytest.mark.parametrize("name", BUNDLES)
def test_recorded_outputs_are_unchanged(name: str, tmp_path: Path) -> None:
    expected = json.loads(SNAPSHOTS.read_text())
    got = render(name, tmp_path)
    changed = sorted(k for k, v in got.items() if expected.get(k) != v)
    assert not changed, f"outputs changed: {changed} (see this module's docstring)"


def update() -> None:
    import tempfile

    digests: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as work:
        for name in BUNDLES:
            digests.update(render(name, Path(work)))
    SNAPSHOTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests)} digests written to {SNAPSHOTS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.unit.test_recorded_snapshots --update")
    update()
