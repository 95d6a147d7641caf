"""Every output of every recorded bundle against the snapshot taken when it was last meant to
change: a refactor must not change what a saved bundle reports.

The snapshot holds each output as text (tests/data/snapshots/BUNDLE/OUTPUT; pprof as protobuf's
text format, pstats as its table sorted), so that a changed output fails with its diff. When a
change is meant to change an output, read that diff, then write the new snapshot with
`python -m tests.unit.test_recorded_snapshots --update`.
"""

from __future__ import annotations

import contextlib
import difflib
import gzip
import io
import marshal
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from profkit.cli import run

from ..support import DATA

SNAPSHOTS = DATA / "snapshots"
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


def as_text(path: Path) -> str:
    """An output as the snapshot keeps it: text as written, the binary formats decoded."""
    data = path.read_bytes()
    if path.name.endswith(".pprof"):
        from google.protobuf import text_format

        from profkit.render.proto import profile_pb2

        profile = profile_pb2.Profile()
        profile.ParseFromString(gzip.decompress(data))  # the gzip header carries a time
        return text_format.MessageToString(profile)
    if path.name.endswith(".pstats"):
        stats = marshal.loads(data)
        return "".join(f"{key!r}: {stats[key]!r}\n" for key in sorted(stats))
    return data.decode()


def render(name: str, work: Path) -> dict[str, str]:
    bundle = COPIES / name
    if bundle.exists():
        shutil.rmtree(bundle)
    shutil.copytree(DATA / name, bundle)
    texts = {}
    for output, args in outputs():
        out = work / f"{name}.{output}"
        argv = [a.format(bundle=bundle, out=out) for a in args]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = run(argv)
        assert code == 0, (output, code)
        texts[output] = as_text(out)
    return texts


@pytest.mark.parametrize("name", BUNDLES)
def test_recorded_outputs_are_unchanged(name: str, tmp_path: Path) -> None:
    got = render(name, tmp_path)
    kept = SNAPSHOTS / name
    diffs = []
    for output, text in sorted(got.items()):
        path = kept / output
        expected = path.read_text() if path.exists() else ""
        if expected != text:
            diff = difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), f"kept/{output}", f"now/{output}"
            )
            diffs.append("".join(list(diff)[:60]))
    assert not diffs, "outputs changed (see this module's docstring):\n" + "\n".join(diffs)


def update() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        for name in BUNDLES:
            kept = SNAPSHOTS / name
            shutil.rmtree(kept, ignore_errors=True)
            kept.mkdir(parents=True)
            for output, text in render(name, Path(work)).items():
                (kept / output).write_text(text)
    print(f"snapshots of {len(BUNDLES)} bundles written to {SNAPSHOTS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.unit.test_recorded_snapshots --update")
    update()
