"""Return sites of the OpenMP fork entry point, found in torch's bundled libgomp and Debian's,
and the tables they come from, read with pyelftools and decoded with capstone."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from pathlib import Path

import pytest
from elftools.dwarf.callframe import FDE
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from profkit.capture.ebpf.placement import code as returns

from .libgomps import BOTH, LIBGOMP, SYSTEM_LIBGOMP, present, torch

# numpy's bundled OpenBLAS (scipy-openblas): exec_blas is its region entry point.
OPENBLAS = sorted((Path(torch.__file__).parents[1] / "numpy.libs").glob("libscipy_openblas*.so"))


def openblas() -> str:
    if not OPENBLAS:
        pytest.skip("this numpy bundles no OpenBLAS")
    return str(OPENBLAS[0])


def build(path: str) -> str:
    """The file's build, as the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def known(path: str, builds: dict[str, dict]) -> dict:
    """What `builds` holds for this file's build; a skip for a build not recorded there (a
    Debian update, another torch or numpy)."""
    found = builds.get(build(path))
    if found is None:
        pytest.skip(f"{path} is build {build(path)}, not one whose values are recorded")
    return found


# What readelf and objdump found in these builds (compared when profkit stopped using them, on
# every function symbol, FDE and instruction): the same symbols, FDEs, PLT and return sites.
BUILDS = {
    # Debian 12's libgomp1 (gcc 12): GOMP_parallel_end inlined, gomp_team_end's `jmp free@plt`.
    "f9a9ad78a8dc39c0": {
        "functions": 455,
        "fdes": 705,
        "plt": [(0xA020, 0xA6A0), (0xA6A0, 0xA6B0)],
        "symbol": ("GOMP_parallel", 0x14070),
        "returns": [0x13DD3, 0x13DFB, 0x1E395, 0x1E3C9],
    },
    # torch 2.13.0's bundled libgomp.so.1 (CET: endbr64, .plt.sec).
    "78511033caddec6c": {
        "functions": 397,
        "fdes": 601,
        "plt": [(0x8570, 0x8C10), (0x8C10, 0x92A0)],
        "symbol": ("GOMP_parallel", 0x116E0),
        "returns": [0x116C6, 0x1CB2C, 0x1CB59],
    },
    # numpy 2.4.6's libscipy_openblas64_: 35 000 symbols, 11 700 FDEs.
    "05c9f9eb89ee68a4": {
        "functions": 11441,
        "fdes": 11696,
        "plt": [(0x15C1B70, 0x15C9670)],
        "symbol": ("exec_blas", 0x5F82D0),
        "returns": [0x5F84D4],
        "local": ("blas_thread_server", 0x5F8070),  # static: in .symtab only
    },
}


@pytest.mark.parametrize("library", BOTH)
def test_gomp_parallel_returns_are_found_through_its_tail_calls(library: Path | None) -> None:
    path = present(library)
    sites = returns.return_sites(path, "GOMP_parallel")
    assert sites, "no return found"
    extents = returns.function_extents(path)
    entry = returns.symbol_address(path, "GOMP_parallel")
    assert entry is not None
    own = returns.extent_of(entry, extents)
    assert own is not None
    # GOMP_parallel ends in a jump to GOMP_parallel_end: its returns lie in other functions.
    assert all(not own[0] <= site < own[1] for site in sites)
    plt = returns.plt_ranges(path)
    kinds = set()
    for site in sites:
        extent = returns.extent_of(site, extents)
        assert extent is not None
        instruction = {i.address: i for i in returns.disassemble(path, *extent)}[site]
        if instruction.kind == returns.RET:
            kinds.add("ret")
        else:
            # A tail call out of the library: a direct jump into the PLT.
            assert instruction.kind == returns.JUMP and instruction.target is not None
            assert returns.extent_of(instruction.target, plt) is not None, instruction
            kinds.add("plt")
    assert "ret" in kinds
    if library == SYSTEM_LIBGOMP:
        assert "plt" in kinds  # gomp_team_end's `jmp free@plt`


@pytest.mark.parametrize("library", [*BOTH, pytest.param("openblas", id="openblas")])
def test_tables_and_return_sites_of_known_builds(library: Path | str | None) -> None:
    path = openblas() if isinstance(library, str) else present(library)
    expected = known(path, BUILDS)
    functions = returns.function_symbols(path)
    assert len(functions) == expected["functions"]
    assert len(returns.function_extents(path)) == expected["fdes"]
    assert returns.plt_ranges(path) == expected["plt"]
    symbol, address = expected["symbol"]
    assert returns.symbol_address(path, symbol) == address
    assert returns.return_sites(path, symbol) == expected["returns"]
    if "local" in expected:
        name, address = expected["local"]
        assert functions[name] == address


def test_symbols_are_the_defined_functions_of_both_tables() -> None:
    path = str(SYSTEM_LIBGOMP)
    functions = returns.function_symbols(path)
    with open(path, "rb") as f:
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        symbols = list(dynsym.iter_symbols())
    defined = {
        s.name
        for s in symbols
        if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
    }
    imported = {s.name for s in symbols if s["st_shndx"] == "SHN_UNDEF"}
    assert set(functions) == defined
    assert "free" in imported and "free" not in functions  # an import has no address here
    assert "GOMP_parallel" in functions and "omp_get_num_threads" in functions


@pytest.mark.parametrize("library", BOTH)
def test_frame_ranges_are_those_of_a_full_pyelftools_parse(library: Path | None) -> None:
    """The reader that skips the unwinding rules finds what pyelftools' own reader finds."""
    path = present(library)
    with open(path, "rb") as f:
        data = f.read()
    cfi = ELFFile(io.BytesIO(data)).get_dwarf_info().EH_CFI_entries()
    full = sorted(
        (e.header["initial_location"], e.header["initial_location"] + e.header["address_range"])
        for e in cfi
        if isinstance(e, FDE)
    )
    assert returns.function_extents(path) == full and len(full) > 100


def test_plt_sections_are_found() -> None:
    ranges = returns.plt_ranges(str(SYSTEM_LIBGOMP))
    assert ranges and all(start < end for start, end in ranges)
    assert returns.plt_ranges("/bin/true")  # every dynamically linked program has one


def test_an_unknown_symbol_or_file_gives_no_answer(tmp_path: Path) -> None:
    assert returns.return_sites(str(LIBGOMP[0]) if LIBGOMP else "/bin/true", "no_such_fn") is None
    assert returns.return_sites(str(tmp_path / "missing.so"), "GOMP_parallel") is None
    text = tmp_path / "libgomp.so.1"
    text.write_text("not an ELF file\n")
    assert returns.return_sites(str(text), "GOMP_parallel") is None
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(SYSTEM_LIBGOMP.read_bytes()[:4096])
    assert returns.return_sites(str(truncated), "GOMP_parallel") is None


def test_a_fifo_under_a_runtime_name_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "libgomp.so.1"
    os.mkfifo(fifo)
    answer: list[object] = []
    reader = threading.Thread(target=lambda: answer.append(returns.return_sites(str(fifo), "x")))
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and answer == [None]


def x86(code: str) -> list[returns.Instruction]:
    return returns.decode("EM_X86_64", bytes.fromhex(code), 0x1000)


def test_x86_control_flow_is_classified() -> None:
    kinds = [
        (i.kind, i.target)
        for i in x86(
            "f30f1efa"  # endbr64
            "c3"  # ret
            "f3c3"  # repz ret
            "f2c3"  # bnd ret
            "e9fb000000"  # jmp 0x1109
            "0f84f0000000"  # je 0x1104
            "ffe0"  # jmp *%rax: may leave the function
            "3effe0"  # notrack jmp *%rax: a jump table
            "e8f0000000"  # call 0x110e
            "ffd3"  # call *%rbx
            "4889f5"  # mov %rsi,%rbp
        )
    ]
    assert kinds == [
        (returns.ENDBR, None),
        (returns.RET, None),
        (returns.RET, None),
        (returns.RET, None),
        (returns.JUMP, 0x1109),
        (returns.JUMP, 0x1104),
        (returns.JUMP, None),
        (returns.TABLE, None),
        (returns.CALL, 0x110E),
        (returns.CALL, None),
        (returns.OTHER, None),
    ]


def test_aarch64_control_flow_is_classified_and_never_claimed_emulated() -> None:
    code = bytes.fromhex(
        "c0035fd6"  # ret
        "02000014"  # b 0x100c
        "02000094"  # bl 0x1010
        "00021fd6"  # br x16
        "41000054"  # b.ne 0x1018
        "400000b4"  # cbz x0, 0x101c
        "40003837"  # tbnz w0, #7, 0x1020
        "20003fd6"  # blr x1
        "1f2003d5"  # nop
    )
    decoded = returns.decode("EM_AARCH64", code, 0x1000)
    assert [(i.kind, i.target) for i in decoded] == [
        (returns.RET, None),
        (returns.JUMP, 0x100C),
        (returns.CALL, 0x1010),
        (returns.JUMP, None),
        (returns.JUMP, 0x1018),
        (returns.JUMP, 0x101C),
        (returns.JUMP, 0x1020),
        (returns.CALL, None),
        (returns.OTHER, None),
    ]
    assert not any(i.emulated for i in decoded)


def test_another_architecture_is_said_unsupported(tmp_path: Path) -> None:
    with pytest.raises(returns.UnreadableCode, match=r"only x86-64 and aarch64 .*EM_PPC64"):
        returns.decode("EM_PPC64", b"\x4e\x80\x00\x20", 0x1000)
    # A file of that machine: no answer, as where objdump could not read it.
    data = bytearray(SYSTEM_LIBGOMP.read_bytes())
    data[18:20] = (21).to_bytes(2, "little")  # e_machine: EM_PPC64
    other = tmp_path / "libgomp.so.1"
    other.write_bytes(bytes(data))
    assert returns.return_sites(str(other), "GOMP_parallel") is None
