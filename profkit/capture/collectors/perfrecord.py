"""perf record: cpu-clock samples with call graphs for every thread, the native truth.

Frame-pointer unwinding is the default: DWARF with 16 KiB stacks writes about 100 times the
data, which `perf script` then takes far longer to read
(docs/results/perf-cost.md#frame-pointers-or-dwarf). PyTorch wheels have no frame pointers, so
fp stacks stop inside libtorch_cpu, but their leaf frames name the kernel at work
(direct_copy_kernel, the OpenMP barrier, page faults), which is what the worker analysis needs;
the dispatcher's call path comes from the eBPF stack walker (py-spy where the walker cannot
run). `--perf-callgraph dwarf` trades size for whole stacks.

Sampling is per CPU by default (`-a`), and `perf script --pid` keeps the target's samples. A
per-thread event (`-p`) is switched in and out with its thread, and an OpenMP pool switches
thousands of times a second, so `-p` costs the target several times what `-a` does
(docs/results/perf-cost.md#per-cpu-or-per-thread). System-wide perf.data holds every process's
samples, so it is deleted once the target's are converted.

`perf script` names frames by reading the files the samples fall in, by the names their
mappings had. A name is not a file (host/mapped.py): a process may put a link to a file only
root may read at the name of a library it mapped. So perf reads through `--symfs`, a private
tree that holds, at each of the target's mapped names, a link to the mapping's own file
(/proc/PID/map_files, checked); no other file is in it, and the kernel's symbols come from
/proc/kallsyms.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from ...bundle.parts import PERF, PERF_DATA, CollectorResult
from ...bundle.safefile import write_new
from ...host.mapped import UnverifiedFile, mapped_files
from ...host.target import Target
from ...host.tools import find_tool
from .. import demangle
from .base import Availability, CaptureContext, CaptureOptions
from .child import ChildTool

CALLGRAPHS = {"fp": ["--call-graph", "fp"], "dwarf": ["--call-graph", "dwarf,16384"]}


def record_args(options: CaptureOptions, scope: list[str], out: Path) -> list[str]:
    """perf record's arguments as a capture runs it (benchmarks/probe_toggle.py runs the same)."""
    return [
        "record",
        "-e",
        "cpu-clock",
        "-F",
        str(options.perf_rate_hz),
        *CALLGRAPHS[options.perf_callgraph],
        "-k",
        "CLOCK_MONOTONIC",
        # perf script runs on this machine, against the very libraries that were mapped:
        # build-ids are not needed, and collecting them when perf exits read the whole file
        # (teardown time that grows with the window: docs/results/own-cost.md#teardown) and
        # copied the sampled libraries into root's ~/.debug.
        "--no-buildid",
        "--no-buildid-cache",
        # No side-band thread for BPF program events (profkit's own probes among them): at
        # exit perf joined it only once its poll timed out, which held up every teardown.
        "--no-bpf-event",
        *scope,
        "--max-size",
        f"{options.perf_max_mb}M",
        "-o",
        str(out),
    ]


class PerfRecordCollector:
    name = "perf_record"

    def __init__(self) -> None:
        self._tool = find_tool("perf")
        self._child: ChildTool | None = None
        self._context: CaptureContext | None = None
        self._cpus = ""

    def available(self, target: Target) -> Availability:
        if self._tool.path is None:
            return Availability(False, "perf not found (apt-get install linux-perf)")
        return Availability(True)

    def start(self, context: CaptureContext) -> None:
        assert self._tool.path is not None
        self._context = context
        options = context.options
        scope = self._scope_args(context)
        self._cpus = scope[2] if len(scope) > 2 else ("all" if scope == ["-a"] else "")
        args = record_args(options, scope, context.directory / PERF_DATA)
        self._child = ChildTool(self.name, self._tool.path, args, context.directory)
        context.register_child(self._child.pid)

    @staticmethod
    def _scope_args(context: CaptureContext) -> list[str]:
        if context.options.perf_scope == "thread":
            return ["-p", str(context.target.pid)]
        # Only the CPUs the target may run on: in a cpuset container that is a fraction of a
        # large machine, and samples elsewhere would all be thrown away.
        try:
            allowed = sorted(os.sched_getaffinity(context.target.pid))
        except OSError:
            return ["-a"]
        if len(allowed) >= (os.cpu_count() or len(allowed)):
            return ["-a"]
        return ["-a", "-C", ",".join(str(cpu) for cpu in allowed)]

    def progress(self) -> int:
        return 0

    def stop(self) -> CollectorResult:
        assert self._child is not None and self._context is not None and self._tool.path
        exit_code = self._child.stop()
        directory = self._context.directory
        options = self._context.options
        notes: dict[str, object] = {
            "callgraph": options.perf_callgraph,
            "rate_hz": options.perf_rate_hz,
            "scope": options.perf_scope,
            "cpus": self._cpus,
            "exit_code": exit_code,
        }
        why = failure_reason(exit_code, self._child.signals_sent, self._child.stderr_text())
        if not (directory / PERF_DATA).exists():
            return CollectorResult(
                self.name,
                "failed",
                why or self._child.stderr_text()[-200:] or f"perf wrote no {PERF_DATA}",
                notes=notes,
            )
        fast_names = demangle.available()
        symfs = Path(tempfile.mkdtemp(prefix="profkit-symfs-"))
        try:
            samples = self._script(directory, symfs, fast_names)
        finally:
            shutil.rmtree(symfs, ignore_errors=True)
        write_new(directory / PERF, json.dumps(samples))
        files: tuple[str, ...] = (PERF_DATA, PERF)
        if notes["scope"] == "cpu":
            # Other processes' stacks must not travel in a bundle made for this one.
            (directory / PERF_DATA).unlink()
            files = (PERF,)
        count = len(samples["samples"]["t_ns"])
        return CollectorResult(
            self.name,
            "ok" if count and not why else "partial",
            why or ("" if count else "no samples"),
            samples=count,
            lost=samples["lost"],
            start_ns=min(samples["samples"]["t_ns"], default=None),
            end_ns=max(samples["samples"]["t_ns"], default=None),
            files=files,
            notes=notes,
        )

    def _script(self, directory: Path, symfs: Path, fast_names: bool) -> dict:
        """The target's samples, named through a tree of its own mapped files (see above)."""
        assert self._context is not None
        pid = self._context.target.pid
        assert self._tool.path is not None  # available() found it
        symbol_tree(pid, symfs)
        command = [
            self._tool.path,
            "script",
            "-i",
            str(directory / PERF_DATA),
            "--symfs",
            str(symfs),
            "--kallsyms",
            "/proc/kallsyms",
            *(["--no-demangle"] if fast_names else []),
            "--no-inline",
            "--show-lost-events",
            "--pid",
            str(pid),
            "-F",
            "tid,time,period,ip,sym,dso",
        ]
        # Streamed: a long capture's text is far larger than its tables.
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
        ) as script:
            assert script.stdout is not None
            samples = parse_script(script.stdout)
        if fast_names:
            samples = demangle.rename_frames(
                samples, demangle.demangle([f[0] for f in samples["frames"]])
            )
        return samples


def symbol_tree(pid: int, root: Path) -> None:
    """Under root (a fresh private directory), each file the process maps at the name its
    mapping has, as a link to the mapping's own file; a mapping that cannot be checked, or a
    name that collides with another, is left out (its frames read as perf's [unknown])."""
    try:
        files = mapped_files(pid)
    except OSError:
        return
    for mapped in files:
        # normpath of an absolute name keeps it under root: a leading '..' has nowhere to go.
        relative = os.path.normpath(mapped.path).lstrip("/")
        if not relative:
            continue
        with contextlib.suppress(UnverifiedFile, OSError):
            via = mapped.checked()
            place = root / relative
            # mkdir never follows a link this tree holds: a name under another's link fails.
            place.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(via, place)


def failure_reason(exit_code: int | None, signals_sent: list[str], stderr: str) -> str:
    """Why perf ended badly, in its own words where it gave them; "" when it ended as asked."""
    text = stderr.strip()
    lowered = text.lower()
    if "perf_event_paranoid" in lowered or "permission denied" in lowered:
        try:
            level = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
        except OSError:
            level = "unknown"
        return f"permission denied (kernel.perf_event_paranoid is {level})"
    if exit_code is not None and exit_code < 0:
        name = signal.Signals(-exit_code).name
        if name not in signals_sent:
            return f"perf was killed by {name}, not by profkit"
        if name == "SIGKILL":
            return "perf did not stop on SIGINT and SIGTERM and was killed"
        return ""
    if exit_code:
        last = text.splitlines()[-1][:150] if text else ""
        return f"perf exited with code {exit_code}" + (f": {last}" if last else "")
    return ""


def _frames(block: list[str]) -> Iterator[tuple[str, str]]:
    for line in block:
        parts = line.strip().split(None, 1)
        if len(parts) < 2:
            continue
        rest = parts[1]
        # A file deleted since it was mapped prints as "(NAME (deleted))".
        deleted = rest.endswith(" (deleted))")
        if deleted:
            rest = rest.removesuffix(" (deleted))") + ")"
        symbol, _, dso = rest.rpartition(" (")
        yield (symbol or rest, dso.removesuffix(")") + (" (deleted)" if deleted else ""))


def parse_script(lines: Iterable[str]) -> dict:
    """Stream `perf script` text into tables: frames, stacks (root first) and sample columns."""
    frames: dict[tuple[str, str], int] = {}
    stacks: dict[tuple[int, ...], int] = {}
    columns: dict[str, list[int]] = {"t_ns": [], "tid": [], "period_ns": [], "stack": []}
    lost = 0
    header: list[str] | None = None
    block: list[str] = []

    def flush() -> None:
        if header is None:
            return
        chain = [frames.setdefault(frame, len(frames)) for frame in _frames(block)]
        chain.reverse()
        columns["stack"].append(stacks.setdefault(tuple(chain), len(stacks)))

    for raw in lines:
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("\t") and header is not None:
            block.append(line)
            continue
        if "LOST" in line and "events" in line:
            lost += next((int(w) for w in line.split() if w.isdigit()), 0)
            continue
        fields = line.replace(":", " ").split()
        if len(fields) < 2 or not fields[0].isdigit():
            continue
        flush()
        block = []
        header = fields
        columns["tid"].append(int(fields[0]))
        columns["t_ns"].append(round(float(fields[1]) * 1e9))
        columns["period_ns"].append(
            int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
        )
    flush()
    return {
        "frames": [list(f) for f in frames],
        "stacks": [list(s) for s in stacks],
        "samples": columns,
        "lost": lost,
    }
