"""Collectors, one module each, behind the Protocol in base.py; capture/registry.py names them.

Nothing is imported here: the eBPF collector (capture/ebpf/) implements base.py's Protocol, and
a registry in this package would make the two packages import each other.
"""
