"""Speed and overhead, printed as ratios measured side by side.

Each benchmark is a module of this package, run from the repository root:

    .venv/bin/python -m benchmarks.NAME [--help]

What they share (the workloads, the alternating bare and measured windows, the A/A control,
the bootstrap interval, the region program's loader) is in benchmarks.common.
"""
