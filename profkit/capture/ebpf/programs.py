"""bcc's programs rendered for one target: what bcc substitutes before it compiles (the target,
the capacities, one entry handler per runtime copy), kept apart from the loading so that the
templating is tested without root. The programs live in probes/*.bpf.c beside this module and
ship inside the wheel.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from ...host.target import Runtime
from .regions import handler_source

# The walker's on-CPU sampling rate, per CPU: a prime off the timer ticks (as perf's 49 and 99),
# and cheap since every other process's sample returns at the first test.
PYTHON_SAMPLE_HZ = 49


def probe_source(name: str) -> str:
    """A program's source with its local header inlined, as bcc compiles text."""
    text = resources.files(__package__ + ".probes").joinpath(name).read_text()
    header = '#include "pywalk.h"'
    if header in text:
        walk = resources.files(__package__ + ".probes").joinpath("pywalk.h").read_text()
        text = text.replace(header, walk)
    return text


@dataclass(frozen=True)
class SchedProgram:
    tgid: int
    slice_capacity: int = 1 << 19  # about 12 MiB of kernel memory; 1 turns the log off

    def source(self) -> str:
        text = probe_source("sched.bpf.c")
        return text.replace("TARGET_TGID", str(self.tgid)).replace(
            "SLICE_CAPACITY", str(max(1, self.slice_capacity))
        )


@dataclass(frozen=True)
class OpenMPProgram:
    """The target's process program: the Python stack walker and its on-CPU sampler
    (probes/pystack.bpf.c, active when compiled with the walker's flags) and the region probes
    of every pool runtime copy it maps (probes/openmp.bpf.c, one entry handler per copy),
    compiled as one."""

    runtimes: tuple[Runtime, ...] = ()
    tgid: int = 0
    region_capacity: int = 1 << 18  # 10 MiB of kernel memory: 2.5 min at 1 700 regions/s
    sample_capacity: int = 1 << 17  # 4 MiB: 22 min of two CPUs sampled at PYTHON_SAMPLE_HZ
    # Distinct native stacks the sampler keeps (0: no native stacks; perf record samples them).
    native_stacks: int = 0
    # The scheduler tracepoints (probes/sched.bpf.c) in the same program, when traced: with the
    # walker they read each Python thread's stack as it leaves the CPU.
    sched: SchedProgram | None = None
    # The sampler learns each worker's dispatcher from who wakes it (sched_waking, on every
    # wakeup of the machine): only where the scheduler's tracepoints fit the budget.
    dispatch_wakeups: bool = False

    def source(self) -> str:
        native = f"#define NATIVE_STACKS {self.native_stacks}\n" if self.native_stacks else ""
        if self.dispatch_wakeups:
            native += "#define DISPATCH_WAKEUPS\n"
        walker = native + (
            probe_source("pystack.bpf.c")
            .replace("TARGET_TGID", str(self.tgid))
            .replace("SAMPLE_CAPACITY", str(self.sample_capacity))
        )
        regions = probe_source("openmp.bpf.c").replace("REGION_CAPACITY", str(self.region_capacity))
        sched = self.sched.source() if self.sched is not None else ""
        return walker + regions + handler_source(list(self.runtimes)) + sched
