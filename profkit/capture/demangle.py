"""C++ names for perf's frames, demangled once per distinct name instead of once per symbol.

`perf script` demangles every symbol of each library it loads, and libtorch_cpu has hundreds of
thousands: on a capture of the fan-out recipe that was nearly half of perf script's time
(docs/results/perf-cost.md#perf-script-and-demangling). With
`--no-demangle` perf prints mangled names, and the few hundred that samples name go through
`c++filt -p` in one call, which prints them as perf does (no parameter lists).
"""

from __future__ import annotations

import subprocess

from ..host.tools import find_binary

CXXFILT = "c++filt"


def available() -> bool:
    return find_binary(CXXFILT) is not None


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled name -> perf-style demangled name, for the names that are mangled."""
    mangled = sorted({name for name in names if name.startswith("_Z")})
    path = find_binary(CXXFILT)
    if not mangled or path is None:
        return {}
    out = subprocess.run(
        [path, "-p"], input="\n".join(mangled) + "\n", capture_output=True, text=True, check=False
    )
    lines = out.stdout.splitlines()
    if len(lines) != len(mangled):  # never pair names up wrongly: keep them mangled
        return {}
    return dict(zip(mangled, lines, strict=True))


def rename_frames(samples: dict, names: dict[str, str]) -> dict:
    """The tables of parse_script with frames renamed; frames and stacks that become equal are
    merged, as perf's own demangling would have had them (overloads differ in parameters only)."""
    frame_ids: dict[tuple[str, str], int] = {}
    frame_map = [
        frame_ids.setdefault((names.get(name, name), dso), len(frame_ids))
        for name, dso in samples["frames"]
    ]
    stack_ids: dict[tuple[int, ...], int] = {}
    stack_map = [
        stack_ids.setdefault(tuple(frame_map[f] for f in stack), len(stack_ids))
        for stack in samples["stacks"]
    ]
    columns = dict(samples["samples"])
    columns["stack"] = [stack_map[s] for s in columns["stack"]]
    return {
        **samples,
        "frames": [list(f) for f in frame_ids],
        "stacks": [list(s) for s in stack_ids],
        "samples": columns,
    }
