"""Load profkit's prebuilt CO-RE programs through libbpf (libbpf.so.1, >= 1.0), by ctypes.

Nothing is compiled on the node: the object is built ahead of time (probes/core/, `make
probes`) against the few kernel types it needs, and libbpf relocates their fields against the
running kernel's BTF (/sys/kernel/btf/vmlinux) as it loads. What bcc substitutes into its
source (the target, the interpreter's layout, the capacities) is set before load: the object's
one read-only global (a struct this module mirrors) and its logs' sizes.

Maps are read through a small table object with the part of bcc's table interface profkit
uses (item access, items(), len), so that the readers serve both loaders.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

BTF_PATH = Path("/sys/kernel/btf/vmlinux")
SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48
BPF_F_UPROBE_MULTI_RETURN = 1
# The kernel that first has multi-uprobe links (with cookies and a pid filter).
UPROBE_MULTI_KERNEL = (6, 6)
PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0
PERF_FLAG_FD_CLOEXEC = 8
ATTR_FREQ = 1 << 10  # perf_event_attr's `freq` bit: sample_freq, not a period
BPF_ANY = 0
# Map types whose size is their capacity (the others count their keys).
ARRAY_TYPES = {2, 6}  # BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY


class CoreUnavailable(RuntimeError):
    """The CO-RE programs cannot load here; the message says why and what to install."""


class _UprobeOpts(ctypes.Structure):
    # struct bpf_uprobe_opts as of libbpf 1.0; `sz` tells libbpf which fields are set.
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ref_ctr_offset", ctypes.c_size_t),
        ("bpf_cookie", ctypes.c_uint64),
        ("retprobe", ctypes.c_bool),
        ("func_name", ctypes.c_char_p),
    ]


class _UprobeMultiAttr(ctypes.Structure):
    # union bpf_attr as BPF_LINK_CREATE reads it for BPF_TRACE_UPROBE_MULTI (libbpf 1.1 knows
    # neither the attach type nor these fields, so the link is made by the syscall itself).
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


@dataclass(frozen=True)
class MultiLink:
    """A multi-uprobe link: a file descriptor of the kernel's, not a libbpf link."""

    fd: int


# A link to destroy(): libbpf's (its address) or a multi-uprobe link.
Link = int | MultiLink


class _PerfEventAttr(ctypes.Structure):
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


def _library() -> ctypes.CDLL:
    # PROFKIT_LIBBPF: a libbpf.so.1 brought along where the node has none installed.
    name = os.environ.get("PROFKIT_LIBBPF") or ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise CoreUnavailable(
            "libbpf is not installed (apt-get install libbpf1, or your distribution's libbpf "
            f"1.x package): {exc}"
        ) from exc
    if not hasattr(lib, "bpf_program__attach_perf_event"):
        raise CoreUnavailable(f"{name} is older than libbpf 1.0")
    pointer, sized, sized32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "bpf_object__open_mem": (pointer, [pointer, sized, pointer]),
        "bpf_object__load": (ctypes.c_int, [pointer]),
        "bpf_object__close": (None, [pointer]),
        "bpf_object__find_map_by_name": (pointer, [pointer, ctypes.c_char_p]),
        "bpf_object__find_program_by_name": (pointer, [pointer, ctypes.c_char_p]),
        "bpf_object__next_map": (pointer, [pointer, pointer]),
        "bpf_map__name": (ctypes.c_char_p, [pointer]),
        "bpf_map__fd": (ctypes.c_int, [pointer]),
        "bpf_map__set_max_entries": (ctypes.c_int, [pointer, ctypes.c_uint32]),
        "bpf_map__max_entries": (ctypes.c_uint32, [pointer]),
        "bpf_map__type": (ctypes.c_int, [pointer]),
        "bpf_map__set_initial_value": (ctypes.c_int, [pointer, pointer, sized]),
        "bpf_program__attach_perf_event": (pointer, [pointer, ctypes.c_int]),
        "bpf_program__attach": (pointer, [pointer]),
        "bpf_program__fd": (ctypes.c_int, [pointer]),
        "bpf_program__set_expected_attach_type": (ctypes.c_int, [pointer, ctypes.c_int]),
        "bpf_program__attach_uprobe_opts": (
            pointer,
            [pointer, ctypes.c_int, ctypes.c_char_p, sized, pointer],
        ),
        "bpf_link__destroy": (ctypes.c_int, [pointer]),
        "bpf_map_lookup_elem": (ctypes.c_int, [ctypes.c_int, pointer, pointer]),
        "bpf_map_update_elem": (ctypes.c_int, [ctypes.c_int, pointer, pointer, ctypes.c_uint64]),
        "bpf_map_get_next_key": (ctypes.c_int, [ctypes.c_int, pointer, pointer]),
        # fd, in and out batch tokens, keys, values, count (in and out), options
        "bpf_map_lookup_batch": (
            ctypes.c_int,
            [ctypes.c_int, pointer, pointer, pointer, pointer, ctypes.POINTER(sized32), pointer],
        ),
        "libbpf_set_print": (pointer, [pointer]),
    }
    for function, (restype, argtypes) in signatures.items():
        symbol = getattr(lib, function)
        symbol.restype, symbol.argtypes = restype, argtypes
    lib.libbpf_set_print(None)  # its warnings would go to the user's terminal
    return lib


def version() -> str:
    """libbpf's version, "" where it cannot be loaded."""
    try:
        lib = _library()
    except CoreUnavailable:
        return ""
    try:
        lib.libbpf_major_version.restype = ctypes.c_uint32
        lib.libbpf_minor_version.restype = ctypes.c_uint32
        return f"{lib.libbpf_major_version()}.{lib.libbpf_minor_version()}"
    except AttributeError:
        return "1.x"


def readiness() -> str:
    """'' when the CO-RE programs can load here, else why not."""
    if not BTF_PATH.exists():
        return f"the kernel has no BTF ({BTF_PATH} is missing): CO-RE needs CONFIG_DEBUG_INFO_BTF"
    try:
        _library()
    except CoreUnavailable as exc:
        return str(exc)
    return ""


def object_bytes(name: str) -> bytes:
    return resources.files(__package__ + ".probes").joinpath("core").joinpath(name).read_bytes()


@dataclass(frozen=True)
class MapType:
    key: Any  # a ctypes type
    value: Any


class Table:
    """One map of a loaded object, read and written as bcc's tables are."""

    def __init__(
        self, lib: ctypes.CDLL, fd: int, types: MapType, entries: int, array: bool
    ) -> None:
        self._lib, self._fd, self.Key, self.Leaf = lib, fd, types.key, types.value
        self._entries, self._array = entries, array

    def _key(self, key: Any) -> Any:
        if isinstance(key, self.Key):
            return key
        return self.Key(getattr(key, "value", key))

    def __getitem__(self, key: Any) -> Any:
        value = self.Leaf()
        if self._lib.bpf_map_lookup_elem(
            self._fd, ctypes.byref(self._key(key)), ctypes.byref(value)
        ):
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, self.Leaf):
            value = self.Leaf(getattr(value, "value", value))
        result = self._lib.bpf_map_update_elem(
            self._fd, ctypes.byref(self._key(key)), ctypes.byref(value), BPF_ANY
        )
        if result:
            raise OSError(ctypes.get_errno(), f"bpf map update: {os.strerror(-result)}")

    def __len__(self) -> int:
        """An array's capacity, a hash's entries (as bcc's tables)."""
        if self._array:
            return self._entries
        return sum(1 for _ in self.keys())

    def keys(self) -> Iterator[Any]:
        previous, current = None, self.Key()
        while not self._lib.bpf_map_get_next_key(
            self._fd, None if previous is None else ctypes.byref(previous), ctypes.byref(current)
        ):
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
        kernel allows (BPF_MAP_LOOKUP_BATCH, 5.6 and later): a log of a few hundred thousand
        entries read one lookup at a time took seconds of the user's wait at the window's end."""
        count = min(count, self._entries)
        if count <= 0:
            return []
        keys, values = (self.Key * count)(), (self.Leaf * count)()
        found, token = 0, self.Key()
        while found < count:
            asked = ctypes.c_uint32(count - found)
            result = self._lib.bpf_map_lookup_batch(
                self._fd,
                None if found == 0 else ctypes.byref(token),
                ctypes.byref(token),
                ctypes.byref(keys, found * ctypes.sizeof(self.Key)),
                ctypes.byref(values, found * ctypes.sizeof(self.Leaf)),
                ctypes.byref(asked),
                None,
            )
            found += asked.value
            if result and ctypes.get_errno() == errno.ENOENT:
                break  # the end of the array
            if result:  # no batch lookups here: one lookup per entry
                return [(i, self[i]) for i in range(count)]
            if asked.value == 0:
                break  # no progress without an error: never spin on a kernel that does this
        return [(int(keys[i]), values[i]) for i in range(found)]


class CoreObject:
    """One prebuilt object: opened, its constant and sizes set, loaded; its programs attached
    and its maps read; close() detaches and frees everything."""

    def __init__(
        self,
        name: str,
        config: ctypes.Structure,
        max_entries: dict[str, int],
        types: dict[str, MapType],
        uprobe_programs: tuple[str, ...] = (),
    ) -> None:
        self._lib = _library()
        self._data = ctypes.create_string_buffer(object_bytes(name))
        self._object = self._lib.bpf_object__open_mem(self._data, len(self._data.raw), None)
        if not self._object:
            raise CoreUnavailable(f"libbpf could not open {name}: {_errno()}")
        self._links: list[Link] = []
        self._pending: list[threading.Thread] = []  # detaches still waiting in the kernel
        self._types = types
        # Uprobe programs loaded for multi-uprobe links where the kernel has them: a link holds
        # every probe point of a program in one file, and closing it waits for the kernel's
        # grace period once, where a link per point waits once each, one after another
        # (about 0.1 s a point; docs/results/core-loader.md). A kernel older than the attach
        # type ignores it, and the points are then linked one by one.
        self.multi_uprobes = False
        wants_multi = bool(uprobe_programs) and _kernel_at_least(UPROBE_MULTI_KERNEL)
        try:
            rodata = self._internal_map(".rodata")
            if self._lib.bpf_map__set_initial_value(
                rodata, ctypes.byref(config), ctypes.sizeof(config)
            ):
                raise CoreUnavailable(f"{name}: its constants do not fit its .rodata")
            for map_name, entries in max_entries.items():
                self._lib.bpf_map__set_max_entries(self._map(map_name), max(1, entries))
            if wants_multi:
                for program in uprobe_programs:
                    self._lib.bpf_program__set_expected_attach_type(
                        self._program(program), BPF_TRACE_UPROBE_MULTI
                    )
            if self._lib.bpf_object__load(self._object):
                raise CoreUnavailable(f"the kernel refused {name}: {_errno()}")
            if wants_multi:
                self.multi_uprobes = self._multi_link_works(uprobe_programs[0])
        except Exception:
            self.close()
            raise

    def _map(self, name: str) -> int:
        found = self._lib.bpf_object__find_map_by_name(self._object, name.encode())
        if not found:
            raise CoreUnavailable(f"the object has no map {name}")
        return int(found)

    def _internal_map(self, suffix: str) -> int:
        current = self._lib.bpf_object__next_map(self._object, None)
        while current:
            if (self._lib.bpf_map__name(current) or b"").decode().endswith(suffix):
                return int(current)
            current = self._lib.bpf_object__next_map(self._object, current)
        raise CoreUnavailable(f"the object has no {suffix} map")

    def _program(self, name: str) -> int:
        found = self._lib.bpf_object__find_program_by_name(self._object, name.encode())
        if not found:
            raise CoreUnavailable(f"the object has no program {name}")
        return int(found)

    def __getitem__(self, name: str) -> Table:
        handle = self._map(name)
        return Table(
            self._lib,
            self._lib.bpf_map__fd(handle),
            self._types[name],
            int(self._lib.bpf_map__max_entries(handle)),
            int(self._lib.bpf_map__type(handle)) in ARRAY_TYPES,
        )

    def run_stats(self, program: str) -> tuple[int, int]:
        """(runs, nanoseconds inside the program) as the kernel counts them while
        kernel.bpf_stats_enabled is 1; (0, 0) where it does not say."""
        fd = self._lib.bpf_program__fd(self._program(program))
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

    def attach(self, program: str) -> None:
        """Attach where the program's section says (a BTF tracepoint: no tracefs needed)."""
        link = self._lib.bpf_program__attach(self._program(program))
        if not link:
            raise CoreUnavailable(f"attaching {program}: {_errno()}")
        self._links.append(int(link))

    def attach_cpu_clock(self, program: str, frequency_hz: int) -> None:
        """The program on a cpu-clock sampling event on every online CPU."""
        machine = os.uname().machine
        if machine not in SYS_PERF_EVENT_OPEN:
            raise CoreUnavailable(f"perf_event_open's number on {machine} is not known")
        libc = ctypes.CDLL(None, use_errno=True)
        handle = self._program(program)
        for cpu in sorted(_online_cpus() or os.sched_getaffinity(0)):
            attr = _PerfEventAttr(
                type=PERF_TYPE_SOFTWARE,
                size=ctypes.sizeof(_PerfEventAttr),
                config=PERF_COUNT_SW_CPU_CLOCK,
                sample_freq=frequency_hz,
                flags=ATTR_FREQ,
            )
            fd = libc.syscall(
                SYS_PERF_EVENT_OPEN[machine], ctypes.byref(attr), -1, cpu, -1, PERF_FLAG_FD_CLOEXEC
            )
            if fd < 0:
                raise CoreUnavailable(f"perf_event_open on CPU {cpu}: {_errno()}")
            link = self._lib.bpf_program__attach_perf_event(handle, fd)
            if not link:
                reason = _errno()
                os.close(fd)
                raise CoreUnavailable(f"perf event on CPU {cpu}: {reason}")
            self._links.append(int(link))  # the link owns the event: destroying it closes it

    def attach_uprobe(
        self, program: str, path: str, offset: int, pid: int, cookie: int, retprobe: bool = False
    ) -> int:
        """The program on one instruction of a file (its offset in the file), in one process;
        the cookie is what the program's bpf_get_attach_cookie() returns there. The link's
        handle, for destroy()."""
        opts = _UprobeOpts(
            sz=ctypes.sizeof(_UprobeOpts), bpf_cookie=cookie, retprobe=retprobe, func_name=None
        )
        link = self._lib.bpf_program__attach_uprobe_opts(
            self._program(program), pid, path.encode(), offset, ctypes.byref(opts)
        )
        if not link:
            raise CoreUnavailable(f"uprobe on {path}+{offset:#x}: {_errno()}")
        self._links.append(int(link))
        return int(link)

    def _link_uprobe_multi(
        self,
        program: str,
        path: str,
        offsets: list[int],
        cookies: list[int],
        pid: int,
        retprobe: bool,
    ) -> int:
        """A multi-uprobe link's descriptor, or -errno."""
        machine = os.uname().machine
        if machine not in SYS_BPF:
            return -errno.ENOSYS
        count = len(offsets)
        name = ctypes.create_string_buffer(path.encode())
        points = (ctypes.c_uint64 * count)(*offsets)
        values = (ctypes.c_uint64 * count)(*cookies)
        attr = _UprobeMultiAttr(
            prog_fd=self._lib.bpf_program__fd(self._program(program)),
            attach_type=BPF_TRACE_UPROBE_MULTI,
            path=ctypes.addressof(name),
            offsets=ctypes.addressof(points),
            cookies=ctypes.addressof(values),
            cnt=count,
            multi_flags=BPF_F_UPROBE_MULTI_RETURN if retprobe else 0,
            pid=pid,
        )
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(
            SYS_BPF[machine], BPF_LINK_CREATE, ctypes.byref(attr), ctypes.sizeof(attr)
        )
        return int(fd) if fd >= 0 else -(ctypes.get_errno() or errno.EINVAL)

    def _multi_link_works(self, program: str) -> bool:
        """The kernel links the program to a point of a file: asked for one in "/", a kernel
        with multi-uprobe links refuses the directory (EBADF), an older one the attach type."""
        fd = self._link_uprobe_multi(program, "/", [0], [0], 0, False)
        if fd >= 0:
            os.close(fd)
            return True
        return fd == -errno.EBADF

    def attach_uprobes(
        self,
        program: str,
        path: str,
        points: list[tuple[int, int]],
        pid: int,
        retprobe: bool = False,
    ) -> list[Link]:
        """The program on instructions of one file, (file offset, cookie) each, in one process:
        one multi-uprobe link where the kernel has them, a link a point elsewhere."""
        if not points:
            return []
        if not self.multi_uprobes:
            return [
                self.attach_uprobe(program, path, offset, pid, cookie, retprobe)
                for offset, cookie in points
            ]
        fd = self._link_uprobe_multi(
            program, path, [o for o, _ in points], [c for _, c in points], pid, retprobe
        )
        if fd < 0:
            where = ",".join(f"{o:#x}" for o, _ in points)
            reason = f"{os.strerror(-fd)} (errno {-fd})"
            if -fd == errno.EINVAL:
                # The kernel's one refusal a user can act on: a probe another tracer holds
                # at one of these instructions with a USDT semaphore offset.
                reason += (
                    "; 'ref_ctr_offset mismatch' in the kernel log means another tracer holds "
                    "a probe here with a USDT semaphore offset"
                )
            raise CoreUnavailable(f"uprobes on {path}+{{{where}}}: {reason}")
        link = MultiLink(fd)
        self._links.append(link)
        return [link]

    def destroy(self, links: list[Link], wait: bool = True) -> None:
        """Detach these links at once. Closing a uprobe's link waits in the kernel for grace
        periods, about 0.1 s a link and one link after another however many threads close
        them (docs/results/core-loader.md); the breakpoints themselves are gone within a
        millisecond of the close, before the waits. So with wait=False the closes run on a
        thread of their own and the caller goes on; close() waits for them."""
        mine = [link for link in links if link in self._links]
        self._links = [link for link in self._links if link not in mine]
        if not mine:
            return
        if wait:
            self._destroy_now(mine)
            return
        thread = threading.Thread(
            target=self._destroy_now, args=(mine,), name="profkit-bpf-detach", daemon=False
        )
        thread.start()
        self._pending.append(thread)

    def _destroy_now(self, links: list[Link]) -> None:
        if len(links) == 1:
            self._destroy_one(links[0])
            return
        with ThreadPoolExecutor(max_workers=min(32, len(links))) as pool:
            list(pool.map(self._destroy_one, links))

    def _destroy_one(self, link: Link) -> None:
        if isinstance(link, MultiLink):
            os.close(link.fd)
        else:
            self._lib.bpf_link__destroy(link)

    def detach(self, wait: bool = True) -> None:
        self.destroy(list(self._links), wait=wait)

    def close(self, wait: bool = True) -> None:
        """Detach everything and free the object. wait=False: the links' closes start now (the
        probes stop at once) and the kernel's waits, then the freeing, finish on a thread that
        the interpreter joins before it exits."""
        if not wait:
            links, self._links = self._links, []
            thread = threading.Thread(
                target=self._close_after, args=(links,), name="profkit-bpf-close", daemon=False
            )
            thread.start()
            return
        self._close_after(list(self._links))

    def _close_after(self, links: list[Link]) -> None:
        if links:
            self._destroy_now(links)
        for thread in self._pending:
            thread.join()
        self._pending = []
        if self._object:
            self._lib.bpf_object__close(self._object)
            self._object = None


def _kernel_at_least(wanted: tuple[int, int]) -> bool:
    release = os.uname().release
    try:
        major, minor = (int(part) for part in release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= wanted


def _online_cpus() -> set[int]:
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return set()
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _errno() -> str:
    number = ctypes.get_errno() or errno.EINVAL
    return f"{os.strerror(number)} (errno {number})"
