"""The process program as the prebuilt CO-RE object (probes/process.bpf.o), loaded by profkit
itself over the bpf system call: no compiler, headers or library on the node, only a kernel
with BTF (5.15 or later, for the region probes' attach cookies).

elfobject.py reads the object and relocates it (its maps' descriptors, its kernel fields'
offsets in the running kernel's BTF); this module creates the maps, fills the read-only config
and freezes it, loads each program, and attaches: the sampler to a cpu-clock event on every CPU,
the scheduler's programs to their BTF tracepoints, the region probes by file offset with each
copy's cookie, one link for every point of a program in a file where the kernel has multi-uprobe
links (6.6 on). Its maps are read with the types the object's BTF gives (program.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import program
from ..btf import TYPEDEF, BtfError, kernel_btf
from ..placement.code import file_offset, symbol_address
from ..placement.regions import Uprobe
from . import LoaderName, LoaderUnavailable, LoadRequest, bpf
from .elfobject import INSN, ObjectError, ObjectFile, read_object, relocate_core

# The kernel that first has multi-uprobe links (with cookies and a pid filter).
UPROBE_MULTI_KERNEL = (6, 6)
# The programs linked many points to a link where the kernel can.
UPROBE_PROGRAMS = (program.REGION_ENTRY, program.REGION_END, program.CALIBRATE)
# The verifier's log, asked for only to say why a program was refused.
LOG_BYTES = 1 << 22
VERSION = "profkit's own loader over the bpf system call"


class CoreUnavailable(LoaderUnavailable):
    """The CO-RE program cannot load here; the message says why and what would help."""


def readiness() -> str:
    """'' where the prebuilt object can load here, else why not."""
    vmlinux = Path("/sys/kernel/btf/vmlinux")
    if not vmlinux.exists():
        return f"the kernel has no BTF ({vmlinux} is missing): CO-RE needs CONFIG_DEBUG_INFO_BTF"
    if os.uname().machine not in bpf.SYS_BPF:
        return f"no bpf system call numbers for {os.uname().machine}"
    return ""


@dataclass(frozen=True)
class Link:
    """What one attachment holds open: a link's descriptor and, for a perf event's, the
    event's; closing them detaches it."""

    fds: tuple[int, ...]


class CoreObject:
    """The object loaded: its maps created, its programs loaded; attach() and its kind put them
    on, destroy() takes them off, close() frees everything."""

    def __init__(
        self,
        config: ctypes.Structure,
        max_entries: Mapping[str, int],
        uprobe_programs: tuple[str, ...] = UPROBE_PROGRAMS,
    ) -> None:
        why = readiness()
        if why:
            raise CoreUnavailable(why)
        self._maps: dict[str, tuple[int, program.MapSpec, int]] = {}  # name -> fd, spec, size
        self._rodata = -1
        self._programs: dict[str, int] = {}
        self._links: list[Link] = []
        self._pending: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.multi_uprobes = False
        try:
            kernel = kernel_btf()
            objfile = read_object(program.probe_file(program.OBJECT), program.object_btf())
            self._create_maps(config, max_entries, objfile)
            wants_multi = _kernel_at_least(UPROBE_MULTI_KERNEL)
            for name in objfile.programs:
                multi = wants_multi and name in uprobe_programs
                self._programs[name] = self._load(name, objfile, kernel, multi)
            if wants_multi and uprobe_programs:
                self.multi_uprobes = self._multi_link_works(uprobe_programs[0])
        except (ObjectError, BtfError, bpf.BpfError) as exc:
            self.close()
            raise CoreUnavailable(f"the kernel refused the prebuilt program: {exc}") from exc
        except Exception:
            self.close()
            raise

    def _create_maps(
        self, config: ctypes.Structure, max_entries: Mapping[str, int], objfile: ObjectFile
    ) -> None:
        kernel = program.kernel_version()
        for name, spec in program.maps().items():
            flags, entries = program.map_shape(
                spec, max_entries.get(name, spec.max_entries), kernel
            )
            fd = bpf.create_map(
                spec.map_type,
                ctypes.sizeof(spec.key),
                ctypes.sizeof(spec.value),
                entries,
                name,
                flags,
            )
            self._maps[name] = (fd, spec, entries)
        # The read-only config: .rodata, its start the config struct, then frozen, so that the
        # verifier reads its fields as constants and drops the branches they rule out.
        data = bytearray(objfile.rodata)
        raw = bytes(config)
        if len(raw) > len(data):
            raise ObjectError("the config does not fit the object's .rodata")
        data[: len(raw)] = raw
        self._rodata = bpf.create_map(bpf.MAP_ARRAY, 4, len(data), 1, ".rodata", bpf.F_RDONLY_PROG)
        value = (ctypes.c_uint8 * len(data)).from_buffer(data)
        bpf.update(self._rodata, ctypes.c_uint32(0), value)
        bpf.freeze(self._rodata)

    def _load(self, name: str, objfile: ObjectFile, kernel: Any, multi: bool) -> int:
        code = objfile.programs[name]
        relocate_core(code, objfile, kernel)
        insns = code.insns
        for index, map_name, addend in code.map_refs:
            at = index * INSN
            fd = self._rodata if map_name == ".rodata" else self._maps[map_name][0]
            pseudo = PSEUDO_MAP_VALUE if map_name == ".rodata" else PSEUDO_MAP_FD
            insns[at + 1] = (insns[at + 1] & 0x0F) | (pseudo << 4)
            original = struct.unpack_from("<i", insns, at + 4)[0]
            struct.pack_into("<i", insns, at + 4, fd)
            if pseudo == PSEUDO_MAP_VALUE:
                struct.pack_into("<i", insns, at + 12, original + addend)
        attach_btf_id = 0
        if code.attach_to:
            found = kernel.named(f"btf_trace_{code.attach_to}", (TYPEDEF,))
            if not found:
                raise ObjectError(f"{name}: the kernel has no tracepoint {code.attach_to}")
            attach_btf_id = found[0]
        expected = bpf.TRACE_UPROBE_MULTI if multi else code.expected_attach_type
        buffer = (ctypes.c_char * len(insns)).from_buffer(insns)
        license = ctypes.create_string_buffer(objfile.license.encode() or b"GPL")
        attr = bpf.ProgLoadAttr(
            prog_type=code.prog_type,
            insn_cnt=len(insns) // INSN,
            insns=ctypes.addressof(buffer),
            license=ctypes.addressof(license),
            prog_name=name.encode()[:15],
            expected_attach_type=expected,
            attach_btf_id=attach_btf_id,
        )
        try:
            return _prog_load(attr, name)
        except bpf.BpfError as exc:
            if exc.errno != errno.EACCES and exc.errno != errno.EINVAL:
                raise
            log = ctypes.create_string_buffer(LOG_BYTES)
            attr.log_level, attr.log_size, attr.log_buf = 1, LOG_BYTES, ctypes.addressof(log)
            try:
                return _prog_load(attr, name)
            except bpf.BpfError as again:
                tail = log.value.decode(errors="replace").strip().splitlines()[-3:]
                raise bpf.BpfError(again.errno, f"{again.strerror}: {' / '.join(tail)}") from None

    def _multi_link_works(self, name: str) -> bool:
        """The kernel links the program to a point of a file: asked for one in "/", a kernel
        with multi-uprobe links refuses the directory (EBADF), an older one the attach type."""
        try:
            fd = bpf.link_uprobe_multi(self._programs[name], "/", [0], [0], 0, False)
        except bpf.BpfError as exc:
            return exc.errno == errno.EBADF
        os.close(fd)
        return True

    # --- maps and statistics ---

    def __getitem__(self, name: str) -> bpf.Table:
        if name not in self._maps:
            raise KeyError(name)
        fd, spec, entries = self._maps[name]
        return bpf.Table(fd, spec.key, spec.value, entries, spec.map_type in bpf.ARRAY_TYPES)

    def run_stats(self, name: str) -> tuple[int, int]:
        fd = self._programs.get(name)
        return bpf.run_stats(fd) if fd is not None else (0, 0)

    # --- attaching ---

    def _add(self, link: Link) -> Link:
        with self._lock:
            self._links.append(link)
        return link

    def attach(self, name: str) -> Link:
        """A BTF tracepoint program, where its attach type says (no tracefs needed)."""
        return self._add(Link((bpf.raw_tracepoint_open(self._programs[name]),)))

    def attach_cpu_clock(self, name: str, frequency_hz: int) -> None:
        """The program on a cpu-clock sampling event on every online CPU."""
        for cpu in sorted(_online_cpus() or os.sched_getaffinity(0)):
            event = bpf.cpu_clock_event(cpu, frequency_hz)
            try:
                link = bpf.link_perf_event(self._programs[name], event)
            except bpf.BpfError:
                os.close(event)
                raise
            self._add(Link((link, event)))

    def attach_uprobe(
        self, name: str, path: str, offset: int, pid: int, cookie: int, retprobe: bool = False
    ) -> Link:
        """The program on one instruction of a file (its offset in the file), in one process;
        the cookie is what bpf_get_attach_cookie() returns there."""
        event = bpf.uprobe_event(path, offset, pid, retprobe)
        try:
            link = bpf.link_perf_event(self._programs[name], event, cookie)
        except bpf.BpfError:
            os.close(event)
            raise
        return self._add(Link((link, event)))

    def attach_uprobes(
        self, name: str, path: str, points: list[tuple[int, int]], pid: int, retprobe: bool = False
    ) -> list[Link]:
        """The program on instructions of one file, (file offset, cookie) each, in one process:
        one multi-uprobe link where the kernel has them, a link a point elsewhere."""
        if not points:
            return []
        if not self.multi_uprobes:
            return [self.attach_uprobe(name, path, o, pid, c, retprobe) for o, c in points]
        try:
            fd = bpf.link_uprobe_multi(
                self._programs[name],
                path,
                [o for o, _ in points],
                [c for _, c in points],
                pid,
                retprobe,
            )
        except bpf.BpfError as exc:
            where = ",".join(f"{o:#x}" for o, _ in points)
            reason = exc.strerror or str(exc)
            if exc.errno == errno.EINVAL:
                # The kernel's one refusal a user can act on: a probe another tracer holds at
                # one of these instructions with a USDT semaphore offset.
                reason += (
                    "; 'ref_ctr_offset mismatch' in the kernel log means another tracer holds "
                    "a probe here with a USDT semaphore offset"
                )
            raise CoreUnavailable(f"uprobes on {path}+{{{where}}}: {reason}") from None
        return [self._add(Link((fd,)))]

    # --- detaching ---

    def destroy(self, links: Sequence[Link], wait: bool = True) -> None:
        """Detach these links at once. Closing a uprobe's link waits in the kernel for grace
        periods, about 0.1 s a link (docs/results/core-loader.md); the breakpoints themselves
        are gone within a millisecond of the close, before the waits. So with wait=False the
        closes run on a thread of their own and the caller goes on; close() waits for them."""
        with self._lock:
            mine = [link for link in links if link in self._links]
            self._links = [link for link in self._links if link not in mine]
        if not mine:
            return
        if wait:
            _close_links(mine)
            return
        thread = threading.Thread(
            target=_close_links, args=(mine,), name="profkit-bpf-detach", daemon=False
        )
        thread.start()
        self._pending.append(thread)

    def detach(self, wait: bool = True) -> None:
        self.destroy(list(self._links), wait=wait)

    def close(self, wait: bool = True) -> None:
        """Detach everything and free the object. wait=False: the links' closes start now (the
        probes stop at once) and the kernel's waits, then the freeing, finish on a thread that
        the interpreter joins before it exits."""
        with self._lock:
            links, self._links = self._links, []
        if not wait:
            threading.Thread(
                target=self._close_after, args=(links,), name="profkit-bpf-close", daemon=False
            ).start()
            return
        self._close_after(links)

    def _close_after(self, links: list[Link]) -> None:
        _close_links(links)
        for thread in self._pending:
            thread.join()
        self._pending = []
        for fd in self._programs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._programs = {}
        for fd in [*(m[0] for m in self._maps.values()), self._rodata]:
            with contextlib.suppress(OSError):
                if fd >= 0:
                    os.close(fd)
        self._maps, self._rodata = {}, -1


# How an instruction names a map: by its descriptor, or (global data) by its value's address.
PSEUDO_MAP_FD, PSEUDO_MAP_VALUE = 1, 2


def _close_links(links: Sequence[Link]) -> None:
    def close(link: Link) -> None:
        for fd in link.fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    if len(links) <= 1:
        for link in links:
            close(link)
        return
    with ThreadPoolExecutor(max_workers=min(32, len(links))) as pool:
        list(pool.map(close, links))


def _kernel_at_least(wanted: tuple[int, int]) -> bool:
    return program.kernel_version() >= wanted


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


# --- the Program interface over the loaded object ---


def load_core(request: LoadRequest) -> CoreProgram:
    values = program.config_values(
        request.pid, request.layout, request.capacities, request.cost_parts
    )
    core = CoreObject(program.config_struct(values), request.capacities.max_entries())
    return CoreProgram(core, request.pid)


class CoreProgram:
    """The prebuilt object loaded for one target (loaders.Program)."""

    name: LoaderName = "core"

    def __init__(self, core: CoreObject, pid: int) -> None:
        self._core, self._pid = core, pid
        self._regions: dict[bool, list[Link]] = {True: [], False: []}
        self._sched: list[Link] = []

    @property
    def uprobe_links(self) -> str:
        """ "multi" where one link holds every point of a program in a file, else "single"."""
        return "multi" if self._core.multi_uprobes else "single"

    def __getitem__(self, map_name: str) -> Any:
        return self._core[map_name]

    def attach_sampler(self, frequency_hz: int) -> None:
        self._core.attach_cpu_clock(program.SAMPLER, frequency_hz)

    def attach_sched(self, waking: bool) -> list[str]:
        attached = []
        points = dict(program.SCHED_PROGRAMS)
        if waking:
            points[program.WAKING_PROGRAM[0]] = program.WAKING_PROGRAM[1]
        try:
            for name, event in points.items():
                self._sched.append(self._core.attach(name))
                attached.append(f"tp_btf:sched:{event}")
        except Exception:
            self.detach_sched()
            raise
        return attached

    def detach_sched(self) -> None:
        links, self._sched = self._sched, []
        self._core.destroy(links)

    def attach_regions(self, probes: Sequence[Uprobe]) -> None:
        groups: dict[tuple[bool, str, str, bool], list[tuple[int, int]]] = {}
        for probe in probes:
            path = probe.target_path()
            address = probe.address
            if address is None:
                address = symbol_address(path, probe.symbol)
                if address is None:
                    raise LookupError(f"{probe.symbol} is not in {probe.path}")
            name = program.REGION_ENTRY if probe.entry else program.REGION_END
            cookie = program.entry_cookie(probe.runtime, probe.requested_arg) if probe.entry else 0
            groups.setdefault((probe.entry, name, path, probe.retprobe), []).append(
                (file_offset(path, address), cookie)
            )
        added: dict[bool, list[Link]] = {True: [], False: []}
        try:
            for (entry, name, path, retprobe), points in groups.items():
                added[entry] += self._core.attach_uprobes(
                    name, path, points, self._pid, retprobe=retprobe
                )
        except Exception:
            self._core.destroy(added[True] + added[False])
            raise
        for entry, links in added.items():
            self._regions[entry] += links

    def detach_regions(self, entries: bool) -> None:
        # The probes stop as the closes begin; the kernel's waits after that need not hold up
        # the window (CoreObject.destroy).
        links, self._regions[entries] = self._regions[entries], []
        self._core.destroy(links, wait=False)

    def attach_calibration(self, path: str, address: int, file_offset: int) -> object:
        return self._core.attach_uprobes(program.CALIBRATE, path, [(file_offset, 0)], os.getpid())

    def detach_calibration(self, handle: object) -> None:
        if isinstance(handle, list):
            self._core.destroy(handle)

    def run_stats(self, programs: Sequence[str]) -> tuple[int, int]:
        runs = nanoseconds = 0
        for name in programs:
            found = self._core.run_stats(name)
            runs, nanoseconds = runs + found[0], nanoseconds + found[1]
        return runs, nanoseconds

    def entry_programs(self) -> list[str]:
        return [program.REGION_ENTRY]

    def record(self, reason: str) -> dict[str, object]:
        return {
            "name": "core",
            "version": VERSION,
            "reason": reason,
            # How the region probes were linked: every point of a program in a file by one
            # link ("multi"), or a link a point.
            "uprobe_links": self.uprobe_links,
        }

    def detach(self) -> None:
        self._core.detach(wait=False)

    def close(self, wait: bool = False) -> None:
        self._core.close(wait=wait)


# The verifier gives up with EAGAIN when a signal arrives while it works (a profiler of profkit
# itself stopping it, a timer); libbpf tries such a load again, up to five times in all.
PROG_LOAD_TRIES = 5


def _prog_load(attr: bpf.ProgLoadAttr, name: str) -> int:
    for _ in range(PROG_LOAD_TRIES - 1):
        try:
            return bpf.bpf(bpf.PROG_LOAD, attr, f"loading {name}")
        except bpf.BpfError as exc:
            if exc.errno != errno.EAGAIN:
                raise
    return bpf.bpf(bpf.PROG_LOAD, attr, f"loading {name}")
