"""The names a Python target's `threading` module gave its threads, read without stopping it.

The kernel's comm of a thread that Python started is the interpreter's name ("python") before
3.14, and at most 15 bytes of the Python name from 3.14; `threading` keeps the whole name in the
Thread object. py-spy reads those objects (sys.modules['threading']._active, each Thread's
_name) from the target's memory for every version it supports, and `py-spy dump --nonblocking`
does so without pausing a thread: one run, a few hundredths of a second, at the capture's start.
Its output is the target's data: the names are bounded and escaped where the bundle reads them
(bundle/names.py), and the output itself is read to a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time

from .tools import find_tool

DUMP_TIMEOUT_S = 5.0
# py-spy's dump holds every thread's stack too: a target with thousands of deep threads writes
# megabytes, and a hostile one could write more. Past this, names are not read.
MAX_DUMP_BYTES = 32 << 20


def python_thread_names(pid: int) -> tuple[dict[int, str], str]:
    """({OS thread id: threading's name}, why there are none where there are none)."""
    tool = find_tool("py-spy")
    if tool.path is None or not tool.usable:
        return {}, "py-spy is not available"
    command = [tool.path, "dump", "--nonblocking", "--json", "--pid", str(pid)]
    try:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        return {}, f"py-spy dump did not start: {exc}"
    try:
        out, _ = _read_bounded(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()
    if out is None:
        return {}, "py-spy dump wrote more than the bound or took too long"
    try:
        threads = json.loads(out)
    except ValueError:
        return {}, "py-spy dump wrote no JSON"
    names: dict[int, str] = {}
    for thread in threads if isinstance(threads, list) else []:
        if not isinstance(thread, dict):
            continue
        tid, name = thread.get("os_thread_id"), thread.get("thread_name")
        if isinstance(tid, int) and tid > 0 and isinstance(name, str) and name:
            names[tid] = name
    return names, "" if names else "py-spy dump found no named thread"


def _read_bounded(child: subprocess.Popen[bytes]) -> tuple[bytes | None, bool]:
    """The child's output up to MAX_DUMP_BYTES within DUMP_TIMEOUT_S; None past either."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None, False
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), True
        size += len(chunk)
        if size > MAX_DUMP_BYTES:
            return None, False
        chunks.append(chunk)
