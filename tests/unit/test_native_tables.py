"""The eBPF sampler's native stacks turned into perf.json's tables, on known stack ids."""

from __future__ import annotations

from profkit.capture.ebpf import native
from profkit.capture.ebpf.native import KERNEL_DSO, UNKNOWN, native_tables

NAMES = {
    (False, 0x10): ("main", "/usr/bin/python3.11"),
    (False, 0x20): ("GOMP_parallel", "/lib/libgomp.so.1"),
    (False, 0x30): ("direct_copy_kernel", "/lib/libtorch_cpu.so"),
    (True, 0x900): ("asm_exc_page_fault", KERNEL_DSO),
    (True, 0x910): ("clear_page_erms", KERNEL_DSO),
}


class Symbols(native.Symbols):
    """profkit's symbols without bcc: the names above."""

    def __init__(self) -> None:
        pass

    def frame(self, address: int, kernel: bool) -> tuple[str, str]:
        return NAMES.get((kernel, address), (UNKNOWN, UNKNOWN))


def _named(tables: dict, stack: int) -> list[str]:
    return [tables["frames"][f][0] for f in tables["stacks"][stack]]


def test_stacks_are_root_first_with_the_kernel_below_the_user_frames() -> None:
    # id -> (user frames, kernel frames), leaf first, as the in-kernel map holds them
    stacks = {11: ([0x30, 0x20, 0x10], []), 12: ([0x30, 0x20, 0x10], [0x910, 0x900])}
    rows = [(300, 7, 12), (100, 8, 11), (200, 7, 12)]
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
    assert tables["lost"] == 0


def test_a_stack_missing_from_the_map_is_lost_not_guessed() -> None:
    stacks: dict[int, tuple[list[int], list[int]]] = {11: ([0x10], [])}
    rows = [(1, 5, 99), (2, 5, 11), (3, 5, 0)]  # 99: not in the map; 0: no stack taken
    tables = native_tables(rows, stacks, pid=1, period_ns=1, symbols=Symbols())
    assert tables["lost"] == 1
    assert tables["samples"]["t_ns"] == [2]
    assert _named(tables, tables["samples"]["stack"][0]) == ["main"]


def test_an_address_outside_every_mapping_is_unknown() -> None:
    stacks: dict[int, tuple[list[int], list[int]]] = {11: ([0xDEAD, 0x10], [])}
    tables = native_tables([(1, 5, 11)], stacks, pid=1, period_ns=1, symbols=Symbols())
    assert tables["frames"][tables["stacks"][0][-1]] == [UNKNOWN, UNKNOWN]
