"""Reading a library's symbol table: profkit's numpy reader against pyelftools.

    .venv/bin/python -m benchmarks.elf_symbols [--library PATH] [--limit-s 20]

The library defaults to torch's libtorch_cpu.so, the largest file a torch process maps. The
numpy reader (profkit/host/elf.py) reads the whole table and sorts its functions; pyelftools
decodes the same table record by record, stopped after --limit-s seconds, and the time for all
of it is projected from the rate it reached. A name lookup is timed on both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from profkit.host.elf import open_elf, read_symbol_table


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--library", type=Path, default=None)
    parser.add_argument("--limit-s", type=float, default=20.0)
    parser.add_argument(
        "--name", default="_ZN2at4_ops5copy_4callERNS_6TensorERKS2_b", help="a symbol to look up"
    )
    args = parser.parse_args()
    library = args.library
    if library is None:
        import torch

        library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    print(f"# {library} ({library.stat().st_size / 2**20:.0f} MiB)")

    begin = time.perf_counter()
    f = open_elf(str(library))
    assert f is not None, library
    with f:
        table = read_symbol_table(f)
        assert table is not None, library
        functions = table.functions()
        read_s = time.perf_counter() - begin
        begin = time.perf_counter()
        found = table.lookup(table.strings(f), args.name)
        lookup_s = time.perf_counter() - begin
    print(
        f"numpy reader: {len(table.symbols)} symbols, {len(functions)} functions sorted in "
        f"{read_s:.3f} s; {args.name} {'found' if found else 'absent'} in {lookup_s:.3f} s"
    )

    with open(library, "rb") as raw:
        elf = ELFFile(raw)
        section = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
        assert isinstance(section, SymbolTableSection)
        total = section.num_symbols()
        begin, decoded = time.perf_counter(), 0
        for _ in section.iter_symbols():
            decoded += 1
            if decoded % 1000 == 0 and time.perf_counter() - begin > args.limit_s:
                break
        spent = time.perf_counter() - begin
        whole = spent * total / max(decoded, 1)
        print(
            f"pyelftools: {decoded} of {total} symbols in {spent:.1f} s, all of them about "
            f"{whole:.0f} s ({whole / read_s:.0f} times the numpy reader)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
