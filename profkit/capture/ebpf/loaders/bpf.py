"""The bpf and perf_event_open system calls, and the maps they create read as bcc's tables are.

The CO-RE loader (core.py) needs no library: these are the kernel's own interfaces, called
through libc's syscall(), with the attribute layouts of linux/bpf.h and linux/perf_event.h (the
union bpf_attr member each command reads). A kernel that does not know a command or a field says
so with an errno, which the callers turn into a reason.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Iterator
from typing import Any

SYS_BPF = {"x86_64": 321, "aarch64": 280}
SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}

MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_GET_NEXT_KEY = 0, 1, 2, 4
PROG_LOAD, RAW_TRACEPOINT_OPEN, BTF_LOAD, MAP_FREEZE = 5, 17, 18, 22
MAP_LOOKUP_BATCH, LINK_CREATE = 24, 28

ANY = 0
F_RDONLY_PROG = 1 << 7
MAP_ARRAY = 2
# Attach types (enum bpf_attach_type).
TRACE_RAW_TP, PERF_EVENT, TRACE_UPROBE_MULTI = 23, 41, 48
F_UPROBE_MULTI_RETURN = 1
# Program types.
PROG_KPROBE, PROG_PERF_EVENT, PROG_TRACING = 2, 7, 26
# Map types whose size is their capacity (the others count their keys).
ARRAY_TYPES = {2, 6}  # BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY

PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0
PERF_FLAG_FD_CLOEXEC = 8
ATTR_FREQ = 1 << 10  # perf_event_attr's `freq` bit: sample_freq, not a period
PERF_EVENT_IOC_ENABLE = 0x2400

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A bpf() or perf_event_open() call the kernel refused."""


def _number(table: dict[str, int]) -> int:
    found = table.get(platform.machine())
    if found is None:
        raise BpfError(errno.ENOSYS, f"no system call numbers for {platform.machine()}")
    return found


def bpf(command: int, attr: ctypes.Structure, what: str) -> int:
    """bpf(command, attr); BpfError naming `what` where the kernel refuses."""
    result = int(
        _libc.syscall(
            ctypes.c_long(_number(SYS_BPF)),
            ctypes.c_int(command),
            ctypes.byref(attr),
            ctypes.c_uint(ctypes.sizeof(attr)),
        )
    )
    if result < 0:
        err = ctypes.get_errno() or errno.EINVAL
        raise BpfError(err, f"{what}: {os.strerror(err)} (errno {err})")
    return result


class MapCreateAttr(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32),
        ("map_name", ctypes.c_char * 16),
        ("map_ifindex", ctypes.c_uint32),
        ("btf_fd", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
    ]


class _ElemAttr(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # next_key for MAP_GET_NEXT_KEY
        ("flags", ctypes.c_uint64),
    ]


class _BatchAttr(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _FdAttr(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_uint32)]


class ProgLoadAttr(ctypes.Structure):
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
        ("prog_btf_fd", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32),
        ("func_info", ctypes.c_uint64),
        ("func_info_cnt", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32),
        ("line_info", ctypes.c_uint64),
        ("line_info_cnt", ctypes.c_uint32),
        ("attach_btf_id", ctypes.c_uint32),
        ("attach_prog_fd", ctypes.c_uint32),
    ]


class BtfLoadAttr(ctypes.Structure):
    _fields_ = [
        ("btf", ctypes.c_uint64),
        ("btf_log_buf", ctypes.c_uint64),
        ("btf_size", ctypes.c_uint32),
        ("btf_log_size", ctypes.c_uint32),
        ("btf_log_level", ctypes.c_uint32),
    ]


class _RawTracepointAttr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_uint64), ("prog_fd", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class _PerfLinkAttr(ctypes.Structure):
    # LINK_CREATE for a perf event (a sampling event, or a uprobe's): its cookie (5.15 on).
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("bpf_cookie", ctypes.c_uint64),
    ]


class _UprobeMultiAttr(ctypes.Structure):
    # LINK_CREATE for BPF_TRACE_UPROBE_MULTI (6.6 on): many points of one file, one link.
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("path", ctypes.c_uint64),
        ("offsets", ctypes.c_uint64),
        ("ref_ctr_offsets", ctypes.c_uint64),
        ("cookies", ctypes.c_uint64),
        ("cnt", ctypes.c_uint32),
        ("multi_flags", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
    ]


class PerfEventAttr(ctypes.Structure):
    # The first fields of struct perf_event_attr; `size` says how much the kernel reads.
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_freq", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
    ]


def create_map(
    map_type: int, key_size: int, value_size: int, max_entries: int, name: str, flags: int = 0
) -> int:
    attr = MapCreateAttr(
        map_type=map_type,
        key_size=key_size,
        value_size=value_size,
        max_entries=max(1, max_entries),
        map_flags=flags,
        map_name=name.encode()[:15],
    )
    return bpf(MAP_CREATE, attr, f"creating map {name}")


def update(fd: int, key: Any, value: Any, flags: int = ANY) -> None:
    attr = _ElemAttr(fd, 0, ctypes.addressof(key), ctypes.addressof(value), flags)
    bpf(MAP_UPDATE_ELEM, attr, "a map update")


def lookup(fd: int, key: Any, value: Any) -> bool:
    attr = _ElemAttr(fd, 0, ctypes.addressof(key), ctypes.addressof(value), 0)
    try:
        bpf(MAP_LOOKUP_ELEM, attr, "a map lookup")
    except BpfError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def next_key(fd: int, key: Any | None, found: Any) -> bool:
    attr = _ElemAttr(fd, 0, 0 if key is None else ctypes.addressof(key), ctypes.addressof(found))
    try:
        bpf(MAP_GET_NEXT_KEY, attr, "a map walk")
    except BpfError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def freeze(fd: int) -> None:
    bpf(MAP_FREEZE, _FdAttr(fd), "freezing a map")


def raw_tracepoint_open(prog_fd: int) -> int:
    """A BTF tracepoint program attached where its attach_btf_id says (no tracefs)."""
    return bpf(RAW_TRACEPOINT_OPEN, _RawTracepointAttr(0, prog_fd), "attaching a BTF tracepoint")


def link_perf_event(prog_fd: int, event_fd: int, cookie: int = 0) -> int:
    attr = _PerfLinkAttr(prog_fd, event_fd, PERF_EVENT, 0, cookie)
    return bpf(LINK_CREATE, attr, "linking a program to a perf event")


def link_uprobe_multi(
    prog_fd: int, path: str, offsets: list[int], cookies: list[int], pid: int, retprobe: bool
) -> int:
    """One link for every point of a program in a file (6.6 on); BpfError where refused."""
    count = len(offsets)
    name = ctypes.create_string_buffer(os.fsencode(path))
    points = (ctypes.c_uint64 * count)(*offsets)
    values = (ctypes.c_uint64 * count)(*cookies)
    attr = _UprobeMultiAttr(
        prog_fd=prog_fd,
        attach_type=TRACE_UPROBE_MULTI,
        path=ctypes.addressof(name),
        offsets=ctypes.addressof(points),
        cookies=ctypes.addressof(values),
        cnt=count,
        multi_flags=F_UPROBE_MULTI_RETURN if retprobe else 0,
        pid=pid,
    )
    return bpf(LINK_CREATE, attr, "linking uprobes")


def perf_event_open(attr: PerfEventAttr, pid: int, cpu: int, what: str) -> int:
    fd = int(
        _libc.syscall(
            ctypes.c_long(_number(SYS_PERF_EVENT_OPEN)),
            ctypes.byref(attr),
            ctypes.c_int(pid),
            ctypes.c_int(cpu),
            ctypes.c_int(-1),
            ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC),
        )
    )
    if fd < 0:
        err = ctypes.get_errno() or errno.EINVAL
        raise BpfError(err, f"{what}: {os.strerror(err)} (errno {err})")
    return fd


def cpu_clock_event(cpu: int, frequency_hz: int) -> int:
    attr = PerfEventAttr(
        type=PERF_TYPE_SOFTWARE,
        size=ctypes.sizeof(PerfEventAttr),
        config=PERF_COUNT_SW_CPU_CLOCK,
        sample_freq=frequency_hz,
        flags=ATTR_FREQ,
    )
    return perf_event_open(attr, -1, cpu, f"a cpu-clock event on CPU {cpu}")


def _pmu(name: str) -> tuple[int, int]:
    """A dynamic PMU's type number, and the config bit of its 'retprobe' format."""
    base = f"/sys/bus/event_source/devices/{name}"
    with open(f"{base}/type") as f:
        pmu_type = int(f.read())
    with open(f"{base}/format/retprobe") as f:
        bit = int(f.read().strip().split(":")[1])
    return pmu_type, bit


def uprobe_event(path: str, offset: int, pid: int, retprobe: bool) -> int:
    """A uprobe at a file offset, in one process, as a perf event (the uprobe PMU)."""
    try:
        pmu_type, bit = _pmu("uprobe")
    except (OSError, ValueError, IndexError) as exc:
        raise BpfError(errno.ENOENT, f"no uprobe PMU in sysfs: {exc}") from exc
    name = ctypes.create_string_buffer(os.fsencode(path))
    attr = PerfEventAttr(
        type=pmu_type,
        size=ctypes.sizeof(PerfEventAttr),
        config=(1 << bit) if retprobe else 0,
        config1=ctypes.addressof(name),
        config2=offset,
    )
    return perf_event_open(attr, pid, -1, f"a uprobe on {path}+{offset:#x}")


def enable(event_fd: int) -> None:
    import fcntl

    fcntl.ioctl(event_fd, PERF_EVENT_IOC_ENABLE, 0)


def run_stats(fd: int) -> tuple[int, int]:
    """(runs, nanoseconds) of a loaded program, from its descriptor's fdinfo; (0, 0) where the
    kernel keeps no statistics (BPF_ENABLE_STATS off, or a kernel before 5.1)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/self/fdinfo/{fd}") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key in ("run_cnt", "run_time_ns"):
                    fields[key] = int(value)
    except (OSError, ValueError):
        return 0, 0
    return fields.get("run_cnt", 0), fields.get("run_time_ns", 0)


class Table:
    """One map, read and written as bcc's tables are (item access, items(), len), with keys and
    values of the ctypes types its BTF gives."""

    def __init__(self, fd: int, key: Any, value: Any, entries: int, array: bool) -> None:
        self._fd, self.Key, self.Leaf = fd, key, value
        self._entries, self._array = entries, array

    def _key(self, key: Any) -> Any:
        if isinstance(key, self.Key):
            return key
        return self.Key(getattr(key, "value", key))

    def __getitem__(self, key: Any) -> Any:
        value = self.Leaf()
        if not lookup(self._fd, self._key(key), value):
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, self.Leaf):
            value = self.Leaf(getattr(value, "value", value))
        update(self._fd, self._key(key), value)

    def __len__(self) -> int:
        """An array's capacity, a hash's entries (as bcc's tables)."""
        if self._array:
            return self._entries
        return sum(1 for _ in self.keys())

    def keys(self) -> Iterator[Any]:
        previous, current = None, self.Key()
        while next_key(self._fd, previous, current):
            yield current
            previous, current = current, self.Key()

    def items(self) -> list[tuple[Any, Any]]:
        found = []
        for key in list(self.keys()):
            try:
                found.append((key, self[key]))
            except KeyError:
                continue  # deleted between the two calls
        return found

    def items_lookup_batch(self) -> list[tuple[Any, Any]]:
        if not self._array:
            return self.items()
        return [(self.Key(index), value) for index, value in self.first(self._entries)]

    def first(self, count: int) -> list[tuple[int, Any]]:
        """An array's first `count` entries, in index order, in as few system calls as the
        kernel allows (BPF_MAP_LOOKUP_BATCH, 5.6 on): a log of a few hundred thousand entries
        read one lookup at a time took seconds of the user's wait at the window's end."""
        count = min(count, self._entries)
        if count <= 0:
            return []
        keys, values = (self.Key * count)(), (self.Leaf * count)()
        found, token = 0, self.Key()
        while found < count:
            asked = count - found
            attr = _BatchAttr(
                in_batch=0 if found == 0 else ctypes.addressof(token),
                out_batch=ctypes.addressof(token),
                keys=ctypes.addressof(keys) + found * ctypes.sizeof(self.Key),
                values=ctypes.addressof(values) + found * ctypes.sizeof(self.Leaf),
                count=asked,
                map_fd=self._fd,
            )
            try:
                bpf(MAP_LOOKUP_BATCH, attr, "a batch lookup")
            except BpfError as exc:
                found += attr.count
                if exc.errno == errno.ENOENT:
                    break  # the end of the array
                return [(i, self[i]) for i in range(count)]  # no batch lookups here
            found += attr.count
            if attr.count == 0:
                break  # no progress without an error: never spin on a kernel that does this
        return [(int(keys[i]), values[i]) for i in range(found)]
