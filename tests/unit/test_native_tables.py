"""The eBPF sampler's native stacks turned into perf.json's tables, on known stack ids."""

from __future__ import annotations

import errno

from profkit.capture.ebpf.native import KERNEL_DSO, UNKNOWN, native_tables


class StackMap:
    """The in-kernel stack-trace map as bcc shows it: walk(id) gives addresses, leaf first."""

    def __init__(self, stacks: dict[int, list[int]]) -> None:
        self.stacks = stacks
        self.walked: list[int] = []

    def walk(self, stack_id: int) -> list[int]:
        self.walked.append(stack_id)
        return self.stacks[stack_id]


NAMES = {
    (False, 0x10): ("main", "/usr/bin/python3.11"),
    (False, 0x20): ("GOMP_parallel", "/lib/libgomp.so.1"),
    (False, 0x30): ("direct_copy_kernel", "/lib/libtorch_cpu.so"),
    (True, 0x900): ("asm_exc_page_fault", KERNEL_DSO),
    (True, 0x910): ("clear_page_erms", KERNEL_DSO),
}


class Symbols:
    def frame(self, address: int, kernel: bool) -> tuple[str, str]:
        return NAMES.get((kernel, address), (UNKNOWN, UNKNOWN))


def _named(tables: dict, stack: int) -> list[str]:
    return [tables["frames"][f][0] for f in tables["stacks"][stack]]


def test_stacks_are_root_first_with_the_kernel_below_the_user_frames() -> None:
    stacks = StackMap({1: [0x30, 0x20, 0x10], 2: [0x910, 0x900]})
    rows = [(300, 7, 1, 2), (100, 8, 1, -errno.EFAULT), (200, 7, 1, 2)]
    tables = native_tables(rows, stacks, pid=1, period_ns=20_408_163, symbols=Symbols())
    samples = tables["samples"]
    assert samples["t_ns"] == [100, 200, 300], "in time order"
    assert samples["tid"] == [8, 7, 7]
    assert samples["period_ns"] == [20_408_163] * 3
    user_only, with_kernel = samples["stack"][0], samples["stack"][1]
    assert _named(tables, user_only) == ["main", "GOMP_parallel", "direct_copy_kernel"]
    assert _named(tables, with_kernel) == [
        "main",
        "GOMP_parallel",
        "direct_copy_kernel",
        "asm_exc_page_fault",
        "clear_page_erms",
    ]
    assert samples["stack"][2] == with_kernel
    assert [f[1] for f in tables["frames"]].count(KERNEL_DSO) == 2
    # Each distinct (user, kernel) pair is read from the map once.
    assert sorted(stacks.walked) == [1, 1, 2]
    assert tables["lost"] == 0


def test_stacks_the_map_could_not_keep_are_lost_not_guessed() -> None:
    stacks = StackMap({1: [0x10]})
    rows = [
        (1, 5, -errno.EEXIST, -errno.EFAULT),  # a hash collision: no stack, counted
        (2, 5, -errno.ENOMEM, -errno.ENOMEM),  # the map is full
        (3, 5, 1, -errno.EEXIST),  # the user stack kept, the kernel's lost
        (4, 5, -errno.EFAULT, -errno.EFAULT),  # nothing to walk: not a loss
    ]
    tables = native_tables(rows, stacks, pid=1, period_ns=1, symbols=Symbols())
    assert tables["lost"] == 3
    assert tables["samples"]["t_ns"] == [3]
    assert _named(tables, tables["samples"]["stack"][0]) == ["main"]


def test_an_address_outside_every_mapping_is_unknown() -> None:
    stacks = StackMap({1: [0xDEAD, 0x10]})
    tables = native_tables([(1, 5, 1, -1)], stacks, pid=1, period_ns=1, symbols=Symbols())
    assert tables["frames"][tables["stacks"][0][-1]] == [UNKNOWN, UNKNOWN]
