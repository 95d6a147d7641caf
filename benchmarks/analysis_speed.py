"""Analysis and rendering speed on a large bundle, per million samples.

    .venv/bin/python -m benchmarks.analysis_speed [--scale 40]

A recorded bundle (tests/data/fanout_quota, 3 s of an 8-thread pool) is tiled in time and over
64 worker threads until it has about the samples of a 30 s capture of a 64-thread pool: perf
samples, eBPF slices and regions, py-spy spans and /proc samples. The script times parsing the
perf script text, loading and analysing the bundle, and rendering the merged SVG, and prints
seconds per million perf samples.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT
from profkit.analysis.pipeline import analyse_bundle
from profkit.analysis.stacks import build
from profkit.capture.collectors.perfrecord import parse_script
from profkit.render.flame_svg import render_svg

SOURCE = ROOT / "tests/data/fanout_quota"


def tile(
    columns: dict[str, list],
    copies: int,
    shift_ns: int,
    time_keys: tuple[str, ...],
    tid_key: str | None = None,
    tid_map: dict[int, list[int]] | None = None,
) -> dict:
    out: dict[str, list] = {k: [] for k in columns}
    for copy in range(copies):
        for i in range(len(columns[next(iter(columns))])):
            for key, values in columns.items():
                value = values[i]
                if key in time_keys:
                    value += copy * shift_ns
                elif key == tid_key and tid_map and value in tid_map:
                    value = tid_map[value][copy % len(tid_map[value])]
                out[key].append(value)
    return out


def build_large(directory: Path, copies: int) -> int:
    shutil.copy(SOURCE / "cgroup.json", directory / "cgroup.json")
    manifest = json.loads((SOURCE / "manifest.json").read_text())
    start, end = manifest["window"]["start_ns"], manifest["window"]["end_ns"]
    span = end - start
    # The window covers every copy, so that analysis reads all of them.
    manifest["window"]["end_ns"] = start + copies * span
    (directory / "manifest.json").write_text(json.dumps(manifest))
    pid = manifest["target"]["pid"]
    perf = json.loads((SOURCE / "perf.json").read_text())
    workers = sorted({t for t in perf["samples"]["tid"] if t != pid})
    # Eight times as many workers: each recorded worker stands for eight.
    tid_map = {w: [w + 100_000 * k for k in range(8)] for w in workers}
    perf["samples"] = tile(perf["samples"], copies, span, ("t_ns",), "tid", tid_map)
    (directory / "perf.json").write_text(json.dumps(perf))
    ebpf = json.loads((SOURCE / "ebpf.json").read_text())
    ebpf["slices"] = tile(ebpf["slices"], copies, span, ("start_ns", "end_ns"), "tid", tid_map)
    ebpf["regions"] = tile(ebpf["regions"], copies, span, ("start_ns", "end_ns"))
    (directory / "ebpf.json").write_text(json.dumps(ebpf))
    spans = json.loads((SOURCE / "pyspy.json").read_text())
    spans["spans"] = tile(spans["spans"], copies, span, ("start_ns", "end_ns"))
    (directory / "pyspy.json").write_text(json.dumps(spans))
    proc = json.loads((SOURCE / "proc.json").read_text())
    samples = proc["samples"]
    extra = {key: list(values) for key, values in samples.items()}
    for worker, clones in tid_map.items():
        rows = [i for i, t in enumerate(samples["tid"]) if t == worker]
        for clone in clones[1:]:
            for i in rows:
                for key in samples:
                    extra[key].append(clone if key == "tid" else samples[key][i])
    proc["samples"] = extra
    (directory / "proc.json").write_text(json.dumps(proc))
    return len(perf["samples"]["t_ns"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=40, help="copies of the recorded window")
    args = parser.parse_args()
    text = (SOURCE / "perf_script.txt").read_text()
    lines = text.splitlines(True)
    reps = max(1, 200_000 // max(1, len(lines)))
    started = time.perf_counter()
    parsed = parse_script(lines * reps)
    parse_s = time.perf_counter() - started
    parsed_samples = len(parsed["samples"]["t_ns"])
    print(
        f"perf script parse: {parsed_samples} samples in {parse_s:.2f} s = "
        f"{parse_s / parsed_samples * 1e6:.1f} s per million samples"
    )
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        samples = build_large(directory, args.scale)
        started = time.perf_counter()
        report = analyse_bundle(directory)
        analyse_s = time.perf_counter() - started
        started = time.perf_counter()
        svg = render_svg(build(report, "merged"), "merged")
        render_s = time.perf_counter() - started
    workers = sum(len(p.pool.workers) for p in report.pools)
    print(
        f"bundle: {samples} perf samples, {workers} pool workers, "
        f"{report.reconciliation.window_seconds * args.scale:.0f} s of capture tiled"
    )
    print(
        f"load + analyse: {analyse_s:.2f} s = {analyse_s / samples * 1e6:.1f} s per million "
        f"perf samples"
    )
    print(f"merged SVG render: {render_s:.2f} s ({len(svg) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
