"""Standard exports of the weighted stacks: folded, speedscope and pprof."""

from __future__ import annotations

import gzip
import json

from ..analysis.stacks import Stack, Stacks

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def folded(stacks: Stacks) -> str:
    """Brendan Gregg's folded format; weights in microseconds of CPU."""
    lines = []
    for stack, seconds in sorted(
        stacks.weights.items(), key=lambda item: [n.name for n in item[0]]
    ):
        weight = round(seconds * 1e6)
        if weight > 0 and stack:
            names = ";".join(node.name.replace(";", ":") for node in stack)
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


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _packed(number: int, values: list[int]) -> bytes:
    return _field(number, b"".join(_varint(v) for v in values))


def pprof(stacks: Stacks) -> bytes:
    """A gzipped profile.proto: sample type cpu/nanoseconds, one location per frame."""
    strings: dict[str, int] = {"": 0}

    def s(text: str) -> int:
        return strings.setdefault(text, len(strings))

    functions: dict[tuple[str, str], int] = {}
    body = bytearray()
    body += _field(1, _int(1, s("cpu")) + _int(2, s("nanoseconds")))  # sample_type
    for stack, seconds in stacks.weights.items():
        value = round(seconds * 1e9)
        if value <= 0 or not stack:
            continue
        ids = [functions.setdefault((n.name, n.kind), len(functions) + 1) for n in stack]
        # pprof lists a sample's locations leaf first.
        body += _field(2, _packed(1, list(reversed(ids))) + _packed(2, [value]))
    for (name, kind), ident in functions.items():
        # One location per function, the same id for both.
        body += _field(4, _int(1, ident) + _field(4, _int(1, ident)))
        body += _field(5, _int(1, ident) + _int(2, s(name)) + _int(3, s(name)) + _int(4, s(kind)))
    body += _int(10, round(stacks.window_seconds * 1e9))  # duration_nanos
    body += _field(11, _int(1, s("cpu")) + _int(2, s("nanoseconds")))  # period_type
    body += _int(12, 10_000_000)  # period
    for text in strings:  # every string is registered by now; index 0 is ""
        body += _field(6, text.encode())
    return gzip.compress(bytes(body))
