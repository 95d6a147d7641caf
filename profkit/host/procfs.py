"""Small, exact readers of /proc: the ground truth for threads, CPU time and identity."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class TaskStat:
    """The fields of /proc/PID[/task/TID]/stat that profkit uses."""

    tid: int
    comm: str
    state: str
    utime_ticks: int
    stime_ticks: int
    num_threads: int
    start_ticks: int
    processor: int
    arg_start: int = 0  # where exec laid out the argument strings; 0 where not readable

    @property
    def cpu_seconds(self) -> float:
        return (self.utime_ticks + self.stime_ticks) / CLOCK_TICKS


def parse_stat(text: str) -> TaskStat:
    # comm may hold spaces and parentheses, so split around the last ')'.
    head, _, rest = text.rpartition(")")
    tid_text, _, comm = head.partition(" (")
    fields = rest.split()
    # fields[0] is field 3 (state) of proc(5).
    return TaskStat(
        tid=int(tid_text),
        comm=comm,
        state=fields[0],
        utime_ticks=int(fields[11]),
        stime_ticks=int(fields[12]),
        num_threads=int(fields[17]),
        start_ticks=int(fields[19]),
        processor=int(fields[36]) if len(fields) > 36 else -1,
        arg_start=int(fields[45]) if len(fields) > 45 else 0,
    )


def stat_counters(text: str) -> tuple[str, int, int, int]:
    """state, utime and stime ticks, and the last CPU of a stat file's text: what a sampler
    reads of every thread every second, without building a TaskStat."""
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[11]), int(fields[12]), int(fields[36]) if len(fields) > 36 else -1


def task_dir(pid: int, tid: int | None = None) -> Path:
    return PROC / str(pid) if tid is None else PROC / str(pid) / "task" / str(tid)


def _task_file(pid: int, tid: int | None, name: str) -> str:
    return f"/proc/{pid}/{name}" if tid is None else f"/proc/{pid}/task/{tid}/{name}"


def _read_small(path: str) -> str:
    """A small /proc file in one read: these files are read per thread, and a target may hold
    tens of thousands of threads."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)


def read_stat(pid: int, tid: int | None = None) -> TaskStat:
    return parse_stat(_read_small(_task_file(pid, tid, "stat")))


def thread_names(pid: int) -> dict[int, str]:
    """Each thread's command name (comm); a thread gone meanwhile is left out."""
    names = {}
    for tid in list_tids(pid):
        try:
            names[tid] = _read_small(_task_file(pid, tid, "comm")).removesuffix("\n")
        except (FileNotFoundError, ProcessLookupError):
            continue
    return names


@dataclass(frozen=True)
class ProcessImage:
    """What an exec replaces. The pid and start time survive exec, so they alone cannot tell a
    process that exec'd from the one inspected: the executable file, the command name and where
    the new stack's argument strings lie (randomised per exec under ASLR) together do."""

    start_ticks: int
    comm: str
    arg_start: int
    exe: tuple[int, int]  # (st_dev, st_ino) of /proc/PID/exe; (0, 0) for kernel threads

    def same_program_run(self, other: ProcessImage) -> bool:
        """True unless an exec separates the two readings. The command name alone is not
        decisive (prctl(PR_SET_NAME) and setproctitle change it in place), so it counts only
        where the argument address could not be read."""
        if (self.start_ticks, self.exe, self.arg_start) != (
            other.start_ticks,
            other.exe,
            other.arg_start,
        ):
            return False
        return bool(self.arg_start) or self.comm == other.comm


def read_image(pid: int) -> ProcessImage:
    """Raises FileNotFoundError or ProcessLookupError once the process is gone, a zombie
    included (its executable link is gone before its /proc entry)."""
    stat = read_stat(pid)
    if stat.state in ("Z", "X"):
        raise ProcessLookupError(f"pid {pid} has exited")
    try:
        exe_stat = os.stat(PROC / str(pid) / "exe")
        exe = (exe_stat.st_dev, exe_stat.st_ino)
    except FileNotFoundError:
        if not (PROC / str(pid)).exists():
            raise
        exe = (0, 0)  # a kernel thread, or an executable deleted and gone
    except PermissionError:
        exe = (0, 0)
    return ProcessImage(stat.start_ticks, stat.comm, stat.arg_start, exe)


def read_context_switches() -> int:
    """Context switches on the whole machine since boot (/proc/stat's ctxt line)."""
    with open(PROC / "stat") as stat:
        for line in stat:
            if line.startswith("ctxt "):
                return int(line.split()[1])
    raise OSError("/proc/stat has no ctxt line")


def list_tids(pid: int) -> list[int]:
    return sorted(int(name) for name in os.listdir(PROC / str(pid) / "task"))


def read_status(pid: int, tid: int | None = None) -> dict[str, str]:
    status: dict[str, str] = {}
    for line in (task_dir(pid, tid) / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    return status


def read_cmdline(pid: int) -> tuple[str, ...]:
    raw = (PROC / str(pid) / "cmdline").read_bytes()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def read_environ(pid: int) -> dict[str, str]:
    """The target's environment at exec time; raises PermissionError when it is not ours."""
    raw = (PROC / str(pid) / "environ").read_bytes()
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return env


def boot_relative_seconds(start_ticks: int) -> float:
    return start_ticks / CLOCK_TICKS


def cpus_allowed(pid: int) -> int:
    try:
        return len(os.sched_getaffinity(pid))
    except OSError:
        return os.cpu_count() or 1
