"""Standard exports of the weighted stacks: folded, speedscope, pprof and pstats."""

from __future__ import annotations

import gzip
import json
import marshal
import re

from ..analysis.stacks import PYTHON, Node, Stack, Stacks
from ..bundle.names import folded_frame
from .proto import profile_pb2

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def folded(stacks: Stacks) -> str:
    """Brendan Gregg's folded format; weights in microseconds of CPU."""
    lines = []
    for stack, seconds in sorted(
        stacks.weights.items(), key=lambda item: [n.name for n in item[0]]
    ):
        weight = round(seconds * 1e6)
        if weight > 0 and stack:
            names = ";".join(folded_frame(node.name) for node in stack)
            lines.append(f"{names} {weight}")
    return "\n".join(lines) + "\n"


def speedscope(stacks: Stacks, name: str) -> str:
    """One profile per thread (or pool) plus the whole view, weights in microseconds."""
    frames: dict[tuple[str, str], int] = {}

    def profile(title: str, weights: dict[Stack, float]) -> dict:
        samples, values = [], []
        for stack, seconds in weights.items():
            weight = round(seconds * 1e6)
            if weight <= 0 or not stack:
                continue
            samples.append([frames.setdefault((n.name, n.kind), len(frames)) for n in stack])
            values.append(weight)
        return {
            "type": "sampled",
            "name": title,
            "unit": "microseconds",
            "startValue": 0,
            "endValue": sum(values),
            "samples": samples,
            "weights": values,
        }

    profiles = [profile(f"{stacks.view} (all threads)", stacks.weights)]
    profiles += [profile(title, weights) for title, weights in stacks.per_thread.items()]
    return json.dumps(
        {
            "$schema": SPEEDSCOPE_SCHEMA,
            "name": name,
            "activeProfileIndex": 0,
            "exporter": "profkit",
            "profiles": profiles,
            "shared": {"frames": [{"name": n, "file": kind} for (n, kind) in frames]},
        }
    )


def pprof(stacks: Stacks) -> bytes:
    """A gzipped profile.proto: sample type cpu/nanoseconds, one location per frame."""
    profile = profile_pb2.Profile()
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    profile.sample_type.add(type=s("cpu"), unit=s("nanoseconds"))
    functions: dict[tuple[str, str], int] = {}
    for stack, seconds in stacks.weights.items():
        value = round(seconds * 1e9)
        if value <= 0 or not stack:
            continue
        ids = [functions.setdefault((n.name, n.kind), len(functions) + 1) for n in stack]
        # pprof lists a sample's locations leaf first.
        profile.sample.add(location_id=reversed(ids), value=[value])
    for (name, kind), ident in functions.items():
        # One location per function, the same id for both.
        profile.location.add(id=ident, line=[profile_pb2.Line(function_id=ident)])
        profile.function.add(id=ident, name=s(name), system_name=s(name), filename=s(kind))
    profile.duration_nanos = round(stacks.window_seconds * 1e9)
    profile.period_type.type, profile.period_type.unit = s("cpu"), s("nanoseconds")
    profile.period = 10_000_000
    profile.string_table.extend(strings)  # every string is registered by now; index 0 is ""
    return gzip.compress(profile.SerializeToString(deterministic=True))


# A Python node's name as analysis/stacks.py writes it: "function (file.py:line)".
PY_NODE = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")
PstatsKey = tuple[str, int, str]


def pstats_key(node: Node) -> PstatsKey:
    """(file, line, function) as cProfile names a function; native and synthetic frames as
    cProfile names built-ins, ("~", 0, name)."""
    found = PY_NODE.match(node.name) if node.kind == PYTHON else None
    if found:
        return (found["file"], int(found["line"]), found["function"])
    return ("~", 0, node.name)


def pstats(stacks: Stacks) -> bytes:
    """The view as a marshalled pstats table (what cProfile's dump_stats writes), in seconds.

    Sampled stacks carry no call counts: each stack a function appears in counts as one call
    (primitive calls: those not already on the stack below it). A function's own time is its
    weight as the leaf; its cumulative time counts each stack once however often it recurses.
    """
    table: dict[PstatsKey, list] = {}  # key -> [cc, nc, tt, ct, callers]

    def entry(key: PstatsKey) -> list:
        return table.setdefault(key, [0, 0, 0.0, 0.0, {}])

    for stack, seconds in stacks.weights.items():
        if seconds <= 0 or not stack:
            continue
        keys = [pstats_key(n) for n in stack]
        seen: set[PstatsKey] = set()
        for depth, key in enumerate(keys):
            row = entry(key)
            leaf = depth == len(keys) - 1
            recursive = key in seen
            row[1] += 1
            if not recursive:
                row[0] += 1
                row[3] += seconds
            if leaf:
                row[2] += seconds
            if depth:
                caller = row[4].setdefault(keys[depth - 1], [0, 0, 0.0, 0.0])
                caller[1] += 1
                caller[0] += 0 if recursive else 1
                caller[2] += seconds if leaf else 0.0
                caller[3] += 0.0 if recursive else seconds
            seen.add(key)
    if not table:  # pstats cannot load an empty table: an empty view is one empty entry
        entry(("~", 0, "[no samples]"))
    frozen = {
        key: (cc, nc, tt, ct, {k: tuple(v) for k, v in callers.items()})
        for key, (cc, nc, tt, ct, callers) in table.items()
    }
    # Version 2: no back-references and no interned-string marks, which depend on how the
    # objects were made, so that equal tables give equal bytes (version 3 and later did not).
    return marshal.dumps(frozen, 2)
