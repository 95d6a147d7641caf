"""Target processes: discovery, identity (pid AND start time) and what threading they carry."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..errors import NoSuchProcess, NotPythonTarget, PermissionDenied, TargetChanged
from . import procfs
from .mapped import MappedFile, UnverifiedFile, mapped_files

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TORCH_NUM_THREADS",
    "GOMP_SPINCOUNT",
    "OMP_WAIT_POLICY",
    "KMP_BLOCKTIME",
)

# Threading runtimes recognised in /proc/PID/maps, by file name.
RUNTIME_PATTERNS = (
    ("libgomp", re.compile(r"/libgomp[^/]*\.so")),
    ("libiomp5", re.compile(r"/libiomp5[^/]*\.so")),
    ("libomp", re.compile(r"/libomp[^/]*\.so")),
    ("openblas", re.compile(r"/lib[a-z_]*openblas[^/]*\.so")),
    ("mkl", re.compile(r"/libmkl_(rt|core|intel_thread|gnu_thread)[^/]*\.so")),
    ("tbb", re.compile(r"/libtbb[^/]*\.so")),
)
PYTHON_MARKERS = (re.compile(r"/libpython3[^/]*\.so"), re.compile(r"/python3(\.\d+)?$"))
TORCH_MARKER = re.compile(r"/torch/lib/libtorch_cpu\.so")


@dataclass(frozen=True)
class Runtime:
    name: str
    path: str  # as the target's maps name it: shown, never opened
    # The mapped file itself, to read and probe (host/mapped.py); None in a saved bundle.
    file: MappedFile | None = field(default=None, compare=False)

    def readable(self) -> str:
        """A path that reaches the mapped file itself, checked now (host/mapped.py); raises
        UnverifiedFile where it cannot be."""
        if self.file is None:
            raise UnverifiedFile(f"{self.path}: recorded, not mapped")
        return self.file.checked()

    @property
    def bundled_by_torch(self) -> bool:
        return "/torch/lib/" in self.path


@dataclass(frozen=True)
class Target:
    pid: int
    start_ticks: int  # with the pid, the process's identity: a reused pid has another start
    cmdline: tuple[str, ...]
    exe: str
    is_python: bool
    has_torch: bool
    threads: int
    runtimes: tuple[Runtime, ...]
    thread_env: dict[str, str] = field(hash=False)
    environ_readable: bool = True
    torch_dir: str | None = None
    cpus_allowed: int = 1
    image: procfs.ProcessImage | None = field(default=None, compare=False)  # to see an exec

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) or f"[{self.exe}]"

    def runtime(self, name: str) -> Runtime | None:
        return next((r for r in self.runtimes if r.name == name), None)

    @property
    def openmp_runtime(self) -> Runtime | None:
        """The OpenMP runtime whose pool size matters most: torch's own copy where torch is
        loaded (a process may map other packages' bundled copies too), else the first mapped."""
        kinds = ("libgomp", "libiomp5", "libomp")
        openmp = sorted(
            (r for r in self.runtimes if r.name in kinds), key=lambda r: kinds.index(r.name)
        )
        torch_own = [r for r in openmp if self.torch_dir and r.path.startswith(self.torch_dir)]
        return next(iter(torch_own or openmp), None)


_T = TypeVar("_T")


def _read_or_raise(pid: int, reader: Callable[[int], _T], what: str) -> _T:
    try:
        return reader(pid)
    except FileNotFoundError as exc:
        raise NoSuchProcess(f"no process with pid {pid}") from exc
    except ProcessLookupError as exc:
        raise NoSuchProcess(f"no process with pid {pid}") from exc
    except PermissionError as exc:
        raise PermissionDenied(f"cannot read {what} of pid {pid}: {_denied()}") from exc


def _denied() -> str:
    """Why access was refused: 'run as root' is advice only to those who are not."""
    if os.geteuid() == 0:
        return (
            "permission denied even to root (the process is outside this container's "
            "namespaces, or profkit lacks CAP_SYS_PTRACE)"
        )
    return "permission denied (run as root or as the target's user)"


def inspect(pid: int, *, require_python: bool = True) -> Target:
    """Read everything profkit needs about a process, refusing non-Python targets by default."""
    if pid <= 0:
        raise NoSuchProcess(f"no process with pid {pid}")
    image = _read_or_raise(pid, procfs.read_image, "stat")
    stat = _read_or_raise(pid, procfs.read_stat, "stat")
    cmdline = _read_or_raise(pid, procfs.read_cmdline, "cmdline")
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError as exc:
        raise NoSuchProcess(f"no process with pid {pid}") from exc
    except PermissionError as exc:
        raise PermissionDenied(f"cannot inspect pid {pid}: {_denied()}") from exc
    except OSError:
        exe = ""  # kernel threads have no executable
    mapped = _read_or_raise(pid, mapped_files, "memory maps")
    files = list(dict.fromkeys(f.path for f in mapped))
    is_python = any(m.search(path) for m in PYTHON_MARKERS for path in [exe, *files])
    if require_python and not is_python:
        raise NotPythonTarget(f"pid {pid} ({Path(exe).name or stat.comm}) is not a Python process")
    torch_lib = next((p for p in files if TORCH_MARKER.search(p)), None)
    runtimes = tuple(
        Runtime(name, file.path, file)
        for file in mapped
        for name, pattern in RUNTIME_PATTERNS
        if pattern.search(file.path)
    )
    try:
        environ = procfs.read_environ(pid)
        readable = True
    except PermissionError:
        environ, readable = {}, False
    except FileNotFoundError as exc:
        raise NoSuchProcess(f"no process with pid {pid}") from exc
    return Target(
        pid=pid,
        start_ticks=stat.start_ticks,
        cmdline=cmdline,
        exe=exe,
        is_python=is_python,
        has_torch=torch_lib is not None,
        threads=stat.num_threads,
        runtimes=runtimes,
        thread_env={k: environ[k] for k in THREAD_ENV_VARS if k in environ},
        environ_readable=readable,
        torch_dir=str(Path(torch_lib).parent.parent) if torch_lib else None,
        cpus_allowed=procfs.cpus_allowed(pid),
        image=image,
    )


def ensure_same(target: Target) -> None:
    """Refuse to act on a pid that now belongs to another process than the one inspected."""
    try:
        now = procfs.read_stat(target.pid)
    except FileNotFoundError as exc:
        raise NoSuchProcess(f"pid {target.pid} has exited") from exc
    if now.start_ticks != target.start_ticks:
        raise TargetChanged(
            f"pid {target.pid} was reused: it started at tick {now.start_ticks}, "
            f"not {target.start_ticks} as when inspected"
        )


def pool_threads(target: Target) -> tuple[int, str]:
    """The intra-op pool size the target's runtime will use, and where that number comes from."""
    for var in ("OMP_NUM_THREADS", "TORCH_NUM_THREADS", "MKL_NUM_THREADS"):
        value = target.thread_env.get(var, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value), var
    # Without a setting, OpenMP and ATen size the pool to the CPUs in the affinity mask.
    return target.cpus_allowed, "visible CPUs (affinity mask)"


def python_processes(match: str | None = None) -> list[Target]:
    pattern = re.compile(match) if match else None
    found = []
    own = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            target = inspect(int(entry), require_python=False)
        except (NoSuchProcess, PermissionDenied, NotPythonTarget):
            continue
        if not target.is_python:
            continue
        if pattern and not pattern.search(target.command):
            continue
        found.append(target)
    return sorted(found, key=lambda t: t.pid)
