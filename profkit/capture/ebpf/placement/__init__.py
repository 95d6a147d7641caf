"""Where the region probes go: which runtime copies a target maps and their entry points
(regions.py), the instruction at each entry and region end that traps cheapest (points.py),
and the code those are read from (code.py: symbols, unwind tables, disassembly, returns)."""
