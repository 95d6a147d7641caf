"""What a user other than root may capture of their own process, decided before anything starts.

Without this, a non-root capture starts every tool and learns what it may not do from each
one's failure: a page of compiler errors from the eBPF build, and a perf that says "no
samples" where the kernel refused it. Each rule below is the kernel's own: eBPF needs
CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN), sampling every CPU needs perf_event_paranoid <= 0 and
sampling one's own process <= 2 (without CAP_PERFMON), and Yama's ptrace_scope >= 1 keeps
py-spy from attaching to a process it did not start (without CAP_SYS_PTRACE).
"""

from __future__ import annotations

from pathlib import Path

from ..host.capabilities import CAPABILITY_BITS, effective_capabilities


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def cannot_run(
    collectors: tuple[str, ...], perf_scope: str, caps: int | None = None
) -> dict[str, str]:
    """The requested collectors this process may not run, each with the kernel's reason."""
    held = effective_capabilities() if caps is None else caps

    def has(name: str) -> bool:
        return bool(held >> CAPABILITY_BITS[name] & 1)

    reasons: dict[str, str] = {}
    if (
        "ebpf" in collectors
        and not has("CAP_SYS_ADMIN")
        and not (has("CAP_BPF") and has("CAP_PERFMON"))
    ):
        reasons["ebpf"] = "loading eBPF programs needs root (CAP_BPF and CAP_PERFMON)"
    level = _read_int("/proc/sys/kernel/perf_event_paranoid")
    for name in ("perf_record", "perf_stat"):
        if name not in collectors or has("CAP_PERFMON") or has("CAP_SYS_ADMIN"):
            continue
        every_cpu = name == "perf_record" and perf_scope == "cpu"
        if level is None:
            reasons[name] = "this kernel has no perf events"
        elif every_cpu and level > 0:
            reasons[name] = (
                f"kernel.perf_event_paranoid is {level}: sampling every CPU needs 0 or less "
                "(--perf-scope thread samples one's own process up to 2)"
            )
        elif level > 2:
            reasons[name] = (
                f"kernel.perf_event_paranoid is {level}: sampling one's own process needs 2 or less"
            )
    scope = _read_int("/proc/sys/kernel/yama/ptrace_scope")
    if "pyspy" in collectors and not has("CAP_SYS_PTRACE") and scope is not None and scope >= 1:
        reasons["pyspy"] = (
            f"kernel.yama.ptrace_scope is {scope}: py-spy may not attach to a process it did "
            "not start (0 allows one's own processes)"
        )
    return reasons
