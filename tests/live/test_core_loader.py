"""The prebuilt CO-RE program where bcc cannot run: a mount namespace hides the kernel headers,
bcc's Python package, perf and the system's libbpf, as on a GPU or Kubernetes node that has
only what pip installed, and profkit still probes every parallel region with its Python stack,
samples every thread, and places the pool's CPU by its workers' dispatcher stacks where the
region probes come off."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipes.launch import attach_args, attach_command

from ..support import ROOT, run_profkit
from .conftest import StartRecipe
from .test_dispatched_samples import assert_sites_by_samples
from .test_pystacks_live import assert_sites_exact, report_of
from .test_safety_live import INT3, code_bytes, probe_addresses

pytestmark = pytest.mark.root

HIDDEN_DIRS = (
    Path("/lib/modules") / os.uname().release,  # the headers link bcc compiles against
    Path("/usr/lib/python3/dist-packages/bcc"),
)
# perf, and every copy of the system's libbpf (the loader needs none: the test proves it).
HIDDEN_FILES = (
    Path("/usr/bin/perf"),
    *sorted({Path(p).resolve() for p in glob.glob("/usr/lib/*/libbpf.so*")}),
    *sorted({Path(p).resolve() for p in glob.glob("/lib/*/libbpf.so*")}),
)


def hidden(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """argv in a private mount namespace where the headers, bcc, perf and libbpf are empty."""
    empty_dir, empty_file = tmp_path / "empty", tmp_path / "empty-file"
    empty_dir.mkdir(exist_ok=True)
    empty_file.write_text("")
    mounts = [f"mount --bind {empty_dir} {d}" for d in HIDDEN_DIRS if d.exists()]
    mounts += [f"mount --bind {empty_file} {f}" for f in sorted(set(HIDDEN_FILES)) if f.exists()]
    script = " && ".join([*mounts, 'exec "$@"'])
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


def without_bcc(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """profkit where the headers, bcc, perf and libbpf are empty."""
    return hidden(tmp_path, [sys.executable, "-m", "profkit", *args])


def test_doctor_names_core_ready_where_bcc_cannot_compile(tmp_path: Path) -> None:
    # The namespace really has no libbpf: loading it fails there (and works outside).
    load = [sys.executable, "-c", "import ctypes; ctypes.CDLL('libbpf.so.1'); print('loaded')"]
    if any("libbpf" in f.name for f in HIDDEN_FILES):
        assert subprocess.run(load, capture_output=True, text=True).stdout.strip() == "loaded"
    inside = hidden(tmp_path, load)
    assert inside.returncode != 0 and "libbpf.so.1" in inside.stderr, inside
    doctor = without_bcc(tmp_path, "doctor", "--json")
    rows = {row["name"]: row for row in json.loads(doctor.stdout)["checks"]}
    assert rows["CO-RE"]["status"] == "ok", rows["CO-RE"]
    assert "profkit's own loader" in rows["CO-RE"]["detail"], rows["CO-RE"]
    # What only bcc uses is missing and, with CO-RE loading, not needed; perf is its own.
    assert rows["bcc"]["status"] == rows["kernel headers"]["status"] == "not needed", rows
    assert not rows["bcc"]["fix"] and not rows["kernel headers"]["fix"], rows
    assert rows["perf"]["status"] == "missing", rows["perf"]


def test_three_sites_exact_on_core_without_headers_bcc_or_perf(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """Default settings, as the bcc test of the same recipe: each region's stack read at its
    entry by the CO-RE region probes, the region counts in the recipe's 1:2:3."""
    recipe = start_recipe("sites.py", "--pool", "torch", "--threads", "4", warmup=1.0)
    out = tmp_path / "b"
    captured = without_bcc(
        tmp_path,
        "attach",
        "--pid",
        str(recipe.pid),
        "--duration",
        "5",
        "--no-report",
        "-o",
        str(out),
    )
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    ebpf = json.loads((out / "ebpf.json").read_text())
    assert ebpf["loader"]["name"] == "core", ebpf["loader"]
    # Kernels from 6.6 link every point of a program in a file at once (one grace period
    # at detach instead of one a point).
    multi = tuple(int(p) for p in os.uname().release.split(".")[:2]) >= (6, 6)
    assert ebpf["loader"]["uprobe_links"] == ("multi" if multi else "single"), ebpf["loader"]
    assert any("GOMP_parallel entry" in a for a in ebpf["attached"]), ebpf["attached"]
    report = assert_sites_exact(out)
    pool = next(p for p in report["pools"] if p["runtime"] == "openmp")
    assert pool["regions_with_stack"] >= 0.99 * pool["regions"] > 0, pool


def test_three_sites_sampled_on_core_without_headers_bcc_or_perf(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    # The samples the shares need come from the pool's CPU: the recipe runs ahead of the other
    # lanes' processes (niceness -10), or a busy machine left its workers 634 samples of 1 068.
    recipe = start_recipe(
        "sites.py", "--pool", "torch", "--threads", "4", "--mb", "1", warmup=1.0, nice=-10
    )
    out = tmp_path / "b"
    captured = without_bcc(
        tmp_path,
        *("attach", "--pid", str(recipe.pid), "--duration", "6", "--perf-rate", "999"),
        # A budget that cannot hold the region probes takes them off (at the default one the
        # rate check may switch them on for part of the window instead, and the regions of
        # that part place the pool): the workers' samples are what is tested here.
        *("--budget", "0.01", "--no-report", "-o", str(out)),
    )
    recipe.stop()  # what follows reads the bundle only
    assert captured.returncode == 0, captured.stderr
    ebpf = json.loads((out / "ebpf.json").read_text())
    assert ebpf["loader"]["name"] == "core", ebpf["loader"]
    assert ebpf["loader"]["version"].startswith("profkit's own loader"), ebpf["loader"]
    assert ebpf["python"]["walker"] == "on" and ebpf["python"]["counts"]["walked"] > 0
    assert (out / "native.json").exists(), "native stacks named without bcc's symbol cache"
    report = report_of(out)
    assert_sites_by_samples(report)
    pool = next(p for p in report["pools"] if p["runtime"] == "openmp")
    # The workers' native stacks, named from the ELF symbol tables: the copy kernel shows.
    assert any("copy_kernel" in work["symbol"] for work in pool["top_work"]), pool


def test_region_probes_linked_one_by_one_where_the_kernel_has_no_multi_links(
    start_recipe: StartRecipe,
) -> None:
    """A kernel older than multi-uprobe links (6.6) gets a link a point: regions are counted
    either way, and every probed instruction is the library's own again after."""
    recipe = start_recipe("sites.py", "--pool", "torch", "--threads", "2", "--mb", "8")
    addresses = probe_addresses(recipe.pid)
    original = code_bytes(recipe.pid, addresses)
    assert original and INT3 not in original.values(), original
    script = f"""
import ctypes, json, os, sys, time
from profkit.capture.ebpf import program
from profkit.capture.ebpf.loaders import LoadRequest, core
from profkit.capture.ebpf.loaders.core import load_core
from profkit.capture.ebpf.placement.regions import find_probes, probeable, region_uprobes
from profkit.host.target import inspect
core.UPROBE_MULTI_KERNEL = (sys.maxsize, 0) if sys.argv[1] == "single" else (0, 0)
target = inspect({recipe.pid})
copies = [find_probes(i, r) for i, r in enumerate(probeable(target.runtimes))]
points = [p for copy in copies if copy for p in region_uprobes(copy)]
capacities = program.Capacities(sample=1024, region=1 << 16, slice=1)
loaded = load_core(LoadRequest({recipe.pid}, None, capacities, len(copies)))
loaded.attach_regions(points)
time.sleep(1.0)
loaded.detach_regions(True)
loaded.detach_regions(False)
count = int(loaded["region_count"][ctypes.c_int(0)].value)
multi = loaded.uprobe_links == "multi"
loaded.close(wait=True)
print(json.dumps({{"multi": multi, "points": len(points), "regions": count}}))
"""
    for links in ("single", "multi"):
        ran = subprocess.run(
            [sys.executable, "-c", script, links],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert ran.returncode == 0, ran.stderr
        found = json.loads(ran.stdout.strip().splitlines()[-1])
        assert found["multi"] is (links == "multi"), found
        assert found["points"] >= 2 and found["regions"] > 0, (links, found)
        assert code_bytes(recipe.pid, addresses) == original, links


def test_a_log_is_read_in_batches_as_written(tmp_path: Path) -> None:
    """The region log read back through the CO-RE table's batch lookups: the used part only, in
    index order, each entry as written; the whole array across the kernel's batches."""
    from profkit.capture.ebpf import program
    from profkit.capture.ebpf.loaders import LoadRequest
    from profkit.capture.ebpf.loaders.core import load_core, readiness
    from profkit.capture.ebpf.logs import read_log

    if readiness():
        pytest.skip(f"CO-RE unavailable: {readiness()}")
    capacity = 70_000
    capacities = program.Capacities(sample=1, region=capacity, slice=1)
    core = load_core(LoadRequest(os.getpid(), None, capacities, 0))
    region = program.maps()["region_log"].value
    try:
        log = core["region_log"]
        written = 50_000
        for i in range(0, written, 7):
            log[i] = region(start_ns=i * 3, end_ns=i * 3 + 1, tid=i % 97 + 1)
        lost = {"regions": 0}
        entries = read_log(core, "region_log", written, lost, "regions")
        assert [index for index, _ in entries] == list(range(written))
        assert all(v.start_ns == (i * 3 if i % 7 == 0 else 0) for i, v in entries)
        assert all(v.tid == (i % 97 + 1 if i % 7 == 0 else 0) for i, v in entries)
        assert lost == {"regions": 0}
        whole = log.items_lookup_batch()
        assert [key.value for key, _ in whole] == list(range(capacity))
        assert read_log(core, "region_log", capacity + 5, lost, "regions")[-1][0] == capacity - 1
        assert lost == {"regions": 5}
    finally:
        core.close(wait=True)


def test_bcc_and_core_captures_probe_one_library_at_once(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """Two targets of one torch captured at the same time, one on bcc and one on CO-RE: both
    get their regions. bcc's bindings registered every uprobe with a stray USDT semaphore
    offset, and the kernel then refused the other loader's probes at the same instructions
    (EINVAL): the second capture had no region probes at all."""
    args = ("shm_fanout.py", "--threads", "2", "--tensor-mb", "1", "--pause-ms", "2")
    first, second = start_recipe(*args, warmup=1.0), start_recipe(*args, warmup=1.0)
    flags = ("--collectors", "ebpf,proc", "--budget", "100", "--ebpf-loader")
    on_bcc = subprocess.Popen(
        attach_command(
            first.pid, duration=60, out=tmp_path / "bcc", report=False, extra=(*flags, "bcc")
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Its region probes are on once their int3 bytes are in the target's code.
        addresses = probe_addresses(first.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and INT3 not in code_bytes(first.pid, addresses).values():
            time.sleep(0.2)
        assert INT3 in code_bytes(first.pid, addresses).values(), "bcc's probes never went on"
        on_core = run_profkit(
            *attach_args(second.pid, duration=1.5, out=tmp_path / "core", report=False),
            *flags,
            "core",
        )
        assert on_core.returncode == 0, on_core.stderr
    finally:
        on_bcc.send_signal(signal.SIGINT)
        _, bcc_stderr = on_bcc.communicate(timeout=60)
    assert on_bcc.returncode == 130, bcc_stderr
    for loader in ("bcc", "core"):
        ebpf = json.loads((tmp_path / loader / "ebpf.json").read_text())
        assert ebpf["loader"]["name"] == loader, ebpf["loader"]
        assert ebpf["region_entries"] > 0 and ebpf["regions"]["tid"], (loader, ebpf["attached"])
