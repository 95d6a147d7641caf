"""Naming native addresses without bcc: this process's own functions, by the ELF symbol tables
of the files it maps, against the addresses the dynamic loader gives for them."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from profkit.host.symbols import UNKNOWN, ProcessSymbols, read_file_symbols


def address_of(library: ctypes.CDLL, name: str) -> int:
    value = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    assert value is not None
    return value


def test_functions_of_a_mapped_library_are_named() -> None:
    libc = ctypes.CDLL(None)
    symbols = ProcessSymbols(os.getpid())
    for name in ("getpid", "malloc", "qsort"):
        address = address_of(libc, name)
        symbol, dso = symbols.frame(address, kernel=False)
        # glibc exports some functions under an alias of the same address (__libc_malloc).
        assert name in symbol, (name, symbol)
        assert "libc" in Path(dso).name, dso
        # An address inside the function names it too.
        assert symbols.frame(address + 2, kernel=False)[0] == symbol


def test_an_address_outside_every_mapping_is_unknown() -> None:
    assert ProcessSymbols(os.getpid()).frame(8, kernel=False) == (UNKNOWN, UNKNOWN)


def test_what_is_not_an_elf_file_gives_no_symbols(tmp_path: Path) -> None:
    text = tmp_path / "not-elf"
    text.write_text("hello")
    assert read_file_symbols(str(text)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_file_symbols(str(fifo)) is None  # refused before any read: no hang
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(Path("/proc/self/exe").read_bytes()[:100])
    assert read_file_symbols(str(truncated)) is None


def test_kernel_addresses_are_named_from_kallsyms() -> None:
    lines = Path("/proc/kallsyms").read_text().splitlines()
    found = next((line.split() for line in lines if line.split()[2] == "schedule"), None)
    if found is None or int(found[0], 16) == 0:
        pytest.skip("kallsyms hides its addresses here (kptr_restrict)")
    address = int(found[0], 16)
    assert ProcessSymbols(os.getpid()).frame(address + 1, kernel=True) == (
        "schedule",
        "[kernel.kallsyms]",
    )


def test_every_kallsyms_function_is_named_as_its_line_says() -> None:
    """The array parse of /proc/kallsyms against a line-by-line one, at every function's own
    address and one byte into it (module lines end in a tab and the module's name)."""
    lines = [line.split() for line in Path("/proc/kallsyms").read_text().splitlines()]
    functions = sorted(
        (int(f[0], 16), f[2]) for f in lines if f[1] in "tTwW" and int(f[0], 16) != 0
    )
    if not functions:
        pytest.skip("kallsyms hides its addresses here (kptr_restrict)")
    names: dict[int, set[str]] = {}
    for address, name in functions:
        names.setdefault(address, set()).add(name)  # aliases share an address
    symbols = ProcessSymbols(os.getpid())
    for address, _ in functions[:: max(1, len(functions) // 2000)]:
        for at in (address, address + 1):
            name, dso = symbols.frame(at, kernel=True)
            assert dso == "[kernel.kallsyms]"
            if at == address or at + 0 not in names:
                assert name in names[address], (hex(at), name, names[address])


def test_a_library_cut_short_after_its_tables_were_read_names_nothing(tmp_path: Path) -> None:
    """Names are read from the open file when asked for: a file truncated under profkit gives
    unknown names, no error and no crash (nothing of it is mapped)."""
    libc = next(
        m.split()[-1]
        for m in Path("/proc/self/maps").read_text().splitlines()
        if "/libc.so" in m or "/libc-" in m
    )
    copy = tmp_path / "libcopy.so"
    copy.write_bytes(Path(libc).read_bytes())
    symbols = read_file_symbols(str(copy))
    assert symbols is not None and len(symbols.starts)
    start = int(symbols.starts[len(symbols.starts) // 2])
    offset = next(o + start - v for o, size, v in symbols.loads if v <= start < v + size)
    assert symbols.name_at(offset)
    os.truncate(copy, 64)
    assert not symbols.name_at(offset)
    assert symbols.file is not None
    symbols.file.close()


def test_the_interpreter_symbols_come_from_the_same_reader(tmp_path: Path) -> None:
    """host/pyruntime finds the interpreter's symbols through host/elf.py: by name, at the
    address the dynamic loader gives, and a file it cannot open is an OSError, so that the
    search for the interpreter goes on to its next candidate."""
    import sysconfig

    from profkit.host.pyruntime.elf import load_elf

    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    library = Path(libdir or "") / (name or "")
    if not library.name.endswith(".so") and ".so." not in library.name:
        pytest.skip("this interpreter is linked statically")
    elf = load_elf(str(library))
    found = elf.lookup("PyList_New")
    assert found is not None and found[0] > 0, found
    python = ctypes.pythonapi
    loaded = address_of(python, "PyList_New")
    maps = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()]
    base = min(
        int(m[0].split("-")[0], 16) for m in maps if len(m) == 6 and m[5] == str(library.resolve())
    )
    assert loaded - base + elf.first_load_vaddr == found[0]
    assert elf.lookup("PyList_New_but_not_a_symbol") is None
    with pytest.raises(OSError):
        load_elf(str(tmp_path / "missing.so"))
