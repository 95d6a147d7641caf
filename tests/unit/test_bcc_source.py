"""bcc's text of the process program, made from its one source: every map, map call and config
read translated, nothing of the CO-RE side left, and a form the translation does not know is an
error. The program's structs reach user space from the object's BTF, checked against ctypes."""

from __future__ import annotations

import ctypes
import re
import struct

import pytest

from profkit.capture.ebpf import program
from profkit.capture.ebpf.btf import Btf, BtfError
from profkit.capture.ebpf.loaders.bcc_source import TranslationError, translate

SOURCE = program.probe_file(program.SOURCE).decode()
WALK = program.probe_file(program.WALK_HEADER).decode()


def bcc_text(
    sched: bool = True,
    cookies: tuple[int, ...] = (3 << 16, (1 << 16) | 1),
    kernel: tuple[int, int] | None = None,
) -> str:
    values = program.config_values(1234, None, program.Capacities(native_stacks=99))
    return translate(
        SOURCE,
        WALK,
        values,
        program.Capacities(native_stacks=99).max_entries(),
        cookies,
        sched,
        kernel,
    )


def test_the_stack_map_is_allocated_on_demand_where_the_kernel_allows() -> None:
    """From 6.1 a perf-event program may use a hash map allocated as it is written, so the
    stack map (3 KB a stack) takes memory only for the stacks seen; before, it is preallocated
    with fewer entries, in bcc's text as in the CO-RE loader (program.map_shape)."""
    spec = program.maps()["pystacks"]
    assert spec.map_flags == program.NO_PREALLOC
    assert ctypes.sizeof(spec.value) == 256 * 12 + 8
    assert 'BPF_F_TABLE("hash", u64, struct pystack, pystacks, 16384, 1);' in bcc_text(
        kernel=(6, 1)
    )
    old = bcc_text(kernel=(5, 15))
    assert 'BPF_TABLE("hash", u64, struct pystack, pystacks, 2048);' in old
    assert program.map_shape(spec, 16384, (6, 0)) == (0, program.PREALLOCATED_STACKS)


def test_every_map_becomes_a_table_with_its_capacity() -> None:
    text = bcc_text(kernel=(6, 18))
    tables = {
        name: kind
        for kind, name in re.findall(
            r'BPF_(?:F_)?TABLE\("(\w+)", [^,]+, [^,]+, (\w+), \d+(?:, \d+)?\);', text
        )
    }
    assert set(tables) == set(program.maps()), "each BTF map, once"
    kinds = {1: "hash", 2: "array", 6: "percpu_array", 9: "lru_hash"}
    assert tables == {name: kinds[spec.map_type] for name, spec in program.maps().items()}
    assert 'BPF_TABLE("hash", u64, struct nstack, native_stacks, 99);' in text
    assert "sample_log, 131072);" in text  # the capacities a capture sets before load


def test_no_co_re_form_is_left() -> None:
    text = bcc_text()
    for form in (
        "bpf_map_lookup_elem",
        "bpf_map_update_elem",
        "SEC(",
        "cfg.",
        "__uint(",
        "bpf_get_attach_cookie",
        "BPF_CORE_READ",
        "preserve_access_index",
    ):
        assert form not in text, form
    assert "#define PROFKIT_BCC 1" in text
    assert ".lookup(" in text and ".update(" in text and ".insert(" in text


def test_the_config_is_compiled_in_as_numbers() -> None:
    text = bcc_text()
    assert "(pid_tgid >> 32) != 1234" in text  # cfg.target_tgid
    assert "if (!0)" in text  # cfg.walker_on of a target the walker does not read


def test_each_copy_gets_an_entry_program_with_its_cookie() -> None:
    text = bcc_text(cookies=(3 << 16, 1 << 16 | 1, 2))
    handlers = re.findall(
        r"int (on_entry_\d+)\(struct pt_regs \*ctx\) \{\n\s+return region_entry\(ctx, (\d+)ULL\);",
        text,
    )
    assert handlers == [
        ("on_entry_0", str(3 << 16)),
        ("on_entry_1", str(1 << 16 | 1)),
        ("on_entry_2", "2"),
    ]


def test_the_scheduler_is_compiled_only_when_traced() -> None:
    assert "#define PROFKIT_SCHED 1" in bcc_text(sched=True)
    assert "#define PROFKIT_SCHED 0" in bcc_text(sched=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s.replace(
                "bpf_map_lookup_elem(&walk_counts,", "bpf_map_lookup_elem(walk_map,"
            ),
            "not &name",
        ),
        (lambda s: s.replace("&fresh, BPF_NOEXIST)", "&fresh, BPF_EXIST)", 1), "flags BPF_EXIST"),
        (
            lambda s: s.replace("BPF_MAP_TYPE_LRU_HASH", "BPF_MAP_TYPE_RINGBUF", 1),
            "BPF_MAP_TYPE_RINGBUF",
        ),
        (
            lambda s: s.replace("cfg.target_tgid", "cfg.pid_of_target", 1),
            "no value for cfg.pid_of_target",
        ),
        (
            lambda s: s + "\nvoid f(void) { bpf_map_delete_elem(&tstates, 0); }\n",
            "other than lookup",
        ),
    ],
)
def test_a_form_the_translation_does_not_know_is_an_error(change: object, message: str) -> None:
    source = change(SOURCE)  # type: ignore[operator]
    values = program.config_values(1, None, program.Capacities())
    with pytest.raises(TranslationError, match=message):
        translate(source, WALK, values, {}, (), False)


def test_every_struct_the_maps_hold_matches_ctypes() -> None:
    """The maps' key and value types are built from the object's BTF and checked field by field
    (program.ctype): the readers' ctypes are the compiler's layout."""
    btf = program.object_btf()
    for spec in program.maps().values():
        for type_id, made in ((spec.key_type_id, spec.key), (spec.value_type_id, spec.value)):
            assert ctypes.sizeof(made) == btf.size(type_id), spec.name
    region = program.maps()["region_log"].value
    assert [name for name, _ in region._fields_] == [f.name for f in btf.layout("region")]


def _btf(members: list[tuple[str, int, int]], size: int) -> bytes:
    """A BTF blob: u32 (id 1), u64 (id 2), and struct s of these (name, type, bit offset)."""
    names = b"\0u32\0u64\0s\0" + b"\0".join(m[0].encode() for m in members) + b"\0"
    offsets: dict[bytes, int] = {}
    at = 1
    for known in [b"u32", b"u64", b"s", *(m[0].encode() for m in members)]:
        offsets[known] = at
        at += len(known) + 1
    types = struct.pack("<III", offsets[b"u32"], 1 << 24, 4) + struct.pack("<I", 32)
    types += struct.pack("<III", offsets[b"u64"], 1 << 24, 8) + struct.pack("<I", 64)
    types += struct.pack("<III", offsets[b"s"], (4 << 24) | len(members), size)
    for name, type_id, bits in members:
        types += struct.pack("<III", offsets[name.encode()], type_id, bits)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(names))
    return header + types + names


def test_a_struct_ctypes_would_lay_out_otherwise_is_refused() -> None:
    """A packed struct (u64 at offset 4) is not what ctypes builds from its fields: refused at
    load, rather than read with every field after it shifted."""
    natural = Btf(_btf([("a", 1, 0), ("b", 2, 64)], 16))
    assert [f.offset for f in natural.layout("s")] == [0, 8]
    made = program.ctype(natural, natural.named("s")[0])
    assert made.b.offset == 8
    packed = Btf(_btf([("a", 1, 0), ("b", 2, 32)], 12))
    with pytest.raises(BtfError, match="ctypes places it elsewhere"):
        program.ctype(packed, packed.named("s")[0])
