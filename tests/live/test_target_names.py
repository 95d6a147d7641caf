"""Names a target chooses are data in every output: a target run as nobody names a function
and its file, through code.replace, with a newline, `;`, ESC, BEL, `<script>` and a megabyte of
text, and its main thread with ESC and BEL; that function dispatches the pool's regions. No
output may carry a raw control character, folded must keep one line per stack, the SVG and the
HTML must stay well-formed, and /metrics must keep one sample per line."""

from __future__ import annotations

import gzip
import json
import marshal
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from profkit.render.proto import profile_pb2

from ..support import NOBODY, run_profkit
from ..watch_support import agent

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
SYSTEM_LIBGOMP = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
EVIL = "evil\n<script>alert(1)</script>\r\"'&</svg>;spin\x1b[31m\x07\x85\u202e"

TARGET = f"""
import ctypes, threading, time
gomp = ctypes.CDLL({SYSTEM_LIBGOMP!r})
body = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)
gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
def hot():
    gomp.GOMP_parallel(body, None, 2, 0)
name = {EVIL!r} + "A" * (1 << 20)
hot.__code__ = hot.__code__.replace(
    co_name=name, co_qualname=name, co_filename={EVIL!r} + "/file.py"
)
with open(f"/proc/self/task/{{threading.get_native_id()}}/comm", "w") as comm:
    comm.write("ma\\x1bin\\x07")
print("ready", flush=True)
while True:
    for _ in range(20):
        hot()
    time.sleep(0.01)
"""
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


@pytest.fixture(scope="module")
def target() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        yield process
    finally:
        process.kill()
        process.wait(timeout=20)


@pytest.fixture(scope="module")
def bundle(target: subprocess.Popen[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("names") / "bundle"
    done = run_profkit(
        "attach", "--pid", str(target.pid), "-d", "3", "--budget", "100", "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert not CONTROL.search(done.stdout + done.stderr), "attach printed a control character"
    return out


def strings(value: Any) -> Iterator[str]:
    """Every string of a parsed JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def clean(texts: Iterator[str] | list[str], what: str) -> None:
    for text in texts:
        assert not CONTROL.search(text), f"{what}: {text[:200]!r}"
        assert "\n" not in text, f"{what}: a newline in {text[:200]!r}"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.scripts += tag == "script"


def test_every_output_shows_the_names_as_data(bundle: Path, tmp_path: Path) -> None:
    made: dict[str, Path] = {}
    for fmt in ("folded", "speedscope", "pprof", "pstats"):
        made[fmt] = tmp_path / f"export.{fmt}"
        assert (
            run_profkit("export", str(bundle), "--format", fmt, "-o", str(made[fmt])).returncode
            == 0
        )
    for view in ("merged", "python", "workers"):
        made[view] = tmp_path / f"{view}.svg"
        assert (
            run_profkit("flame", str(bundle), "--view", view, "-o", str(made[view])).returncode == 0
        )
    made["timeline"] = tmp_path / "trace.json"
    assert run_profkit("timeline", str(bundle), "-o", str(made["timeline"])).returncode == 0
    made["html"] = tmp_path / "report.html"
    assert (
        run_profkit("report", str(bundle), "--format", "html", "-o", str(made["html"])).returncode
        == 0
    )
    text = run_profkit("report", str(bundle))
    report = run_profkit("report", str(bundle), "--format", "json")
    assert text.returncode == 0 and report.returncode == 0

    # The name reached the outputs, escaped: the site is the crafted function.
    assert "evil\\x0a<script>" in text.stdout or "evil\\x0a" in text.stdout, text.stdout
    # Line-based text: no control character but the newlines that end lines.
    for name, body in (("text", text.stdout), ("folded", made["folded"].read_text())):
        clean(body.splitlines(), name)
    folded = made["folded"].read_text().splitlines()
    assert all(re.fullmatch(r".+ \d+", line) for line in folded), folded
    # One folded line per stack: as many as the speedscope export's whole-process samples.
    speedscope = json.loads(made["speedscope"].read_text())
    assert len(folded) == len(speedscope["profiles"][0]["samples"])
    assert any("evil\\x0a" in line for line in folded)
    # The megabyte of text is cut: no line, no file is huge.
    assert max(len(line) for line in folded) < 8192
    assert all(path.stat().st_size < 4 << 20 for path in made.values())
    # JSON outputs: their strings as parsed, not only their bytes.
    for name in ("speedscope", "timeline"):
        clean(strings(json.loads(made[name].read_text())), name)
    clean(strings(json.loads(report.stdout)), "json report")
    # pprof's string table and pstats' keys.
    profile = profile_pb2.Profile()
    profile.ParseFromString(gzip.decompress(made["pprof"].read_bytes()))
    clean(list(profile.string_table), "pprof")
    stats = marshal.loads(made["pstats"].read_bytes())
    clean([part for key in stats for part in key if isinstance(part, str)], "pstats")
    # XML: every SVG parses, and so does each SVG the HTML holds; the HTML runs no script of
    # the target's (its own flame script aside).
    for view in ("merged", "python", "workers"):
        root = ET.fromstring(made[view].read_bytes())
        named = [e for e in root.iter() if e.tag.split("}")[-1] in ("title", "text")]
        clean(["".join(e.itertext()) for e in named], f"{view}.svg")
        clean([v for e in root.iter() for v in e.attrib.values()], f"{view}.svg attributes")
    html = made["html"].read_text()
    assert not CONTROL.search(html)
    assert "<script>alert" not in html
    for svg in re.findall(r"<svg.*?</svg>", html, re.DOTALL):
        ET.fromstring(svg)
    tags = _Tags()
    tags.feed(html)
    assert tags.scripts <= 1, tags.scripts


def test_metrics_keep_one_sample_per_line(target: subprocess.Popen[str]) -> None:
    with agent("--pid", str(target.pid), "--interval", "2") as watch:
        watch.wait_serving()
        body = watch.wait_for(lambda m: "profkit_site_cpu_seconds_total" in m and "evil" in m)
        code, _ = watch.terminate()
    assert code == 0, watch.output
    assert not CONTROL.search(body)
    assert not CONTROL.search(watch.output)
    # The exposition format: a comment, or a metric name, labels and a value, on each line.
    sample = re.compile(r'[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? \S+( \d+)?')
    for line in body.splitlines():
        assert line.startswith("#") or sample.fullmatch(line), line[:300]
    site = next(line for line in body.splitlines() if "evil" in line and "site=" in line)
    assert "\\\\x0a" in site and "<script>" in site, site[:300]
