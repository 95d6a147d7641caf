"""bcc's text of the process program, made from its one source (probes/process.bpf.c).

The source is written for libbpf's CO-RE, and keeps to a few forms this translation knows (its
header says which). bcc then compiles, for one target:
- each BTF map definition as bcc's BPF_TABLE, with the capacities the loader sets before load;
- bpf_map_lookup_elem(&map, key) as map.lookup(key), and bpf_map_update_elem(&map, key, value,
  BPF_ANY / BPF_NOEXIST) as map.update / map.insert;
- the read-only global `cfg` as numbers (bcc has no read-only data), every `cfg.field`
  replaced by its value;
- no section annotations (bcc attaches by function name); and, because bcc has no attach
  cookies, one entry program per runtime copy, on_entry_N, with that copy's cookie compiled in;
- PROFKIT_BCC defined, so that the source's few loader-specific blocks (includes, the
  tracepoints' arguments) take bcc's side, and PROFKIT_SCHED as asked: bcc attaches a
  TRACEPOINT_PROBE as it loads, so the scheduler's programs are compiled only when traced.

Whatever the translation does not recognise is an error, not text passed through: a form the
source gained and this module did not learn fails the tests (tests/unit/test_bcc_source.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from .. import program

MAP_TYPES = {
    "BPF_MAP_TYPE_HASH": "hash",
    "BPF_MAP_TYPE_ARRAY": "array",
    "BPF_MAP_TYPE_PERCPU_ARRAY": "percpu_array",
    "BPF_MAP_TYPE_LRU_HASH": "lru_hash",
    "BPF_MAP_TYPE_PROG_ARRAY": "prog",
}
_MAP_BLOCK = re.compile(
    r"struct\s*\{\s*"
    r"__uint\(type,\s*(?P<type>\w+)\);\s*"
    r"__uint\(max_entries,\s*(?P<entries>\d+)\);\s*"
    r"(?:__uint\(map_flags,\s*(?P<flags>\w+)\);\s*)?"
    r"__type\(key,\s*(?P<key>[^)]+)\);\s*"
    r"__type\(value,\s*(?P<value>[^)]+)\);\s*"
    r"\}\s*(?P<name>\w+)\s+SEC\(\"\.maps\"\);"
)
_CFG_DECLARATION = re.compile(r"^const volatile struct process_config cfg = \{\};\n", re.M)
_CFG_FIELD = re.compile(r"\bcfg\.(\w+)\b")
_SECTION = re.compile(r'^SEC\("[^"]+"\)\n', re.M)
_INCLUDE_WALK = '#include "pywalk.h"'
# Comments go first: they quote the very forms translated. (No string of the source holds "//".)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


class TranslationError(ValueError):
    """The source holds a form the translation does not know."""


def _bcc_side(text: str) -> str:
    """The text with each `#ifndef PROFKIT_BCC` block's CO-RE side taken out (its #else or
    #elif side kept, as `#if 1` or `#if COND`): what bcc's preprocessor would drop is not
    translated, and holds forms only CO-RE knows."""
    out: list[str] = []
    lines = iter(text.split("\n"))
    for line in lines:
        if line.strip() != "#ifndef PROFKIT_BCC":
            out.append(line)
            continue
        depth = 0
        for skipped in lines:
            directive = skipped.strip()
            if directive.startswith(("#if", "#ifdef", "#ifndef")):
                depth += 1
            elif directive.startswith("#endif"):
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and directive.startswith("#else"):
                out.append("#if 1")
                break
            elif depth == 0 and directive.startswith("#elif"):
                out.append("#if " + directive.removeprefix("#elif").strip())
                break
        else:
            raise TranslationError("an #ifndef PROFKIT_BCC block without its #endif")
    return "\n".join(out)


def _calls(text: str, function: str) -> list[tuple[int, int, list[str]]]:
    """(start, end, arguments) of each call of `function`, its arguments split at the commas
    that are not inside parentheses."""
    found = []
    for match in re.finditer(rf"\b{function}\(", text):
        depth, args, current = 1, [], match.end()
        at = match.end()
        while depth:
            if at >= len(text):
                raise TranslationError(f"an unclosed call of {function}")
            char = text[at]
            if char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
            elif char == "," and depth == 1:
                args.append(text[current:at].strip())
                current = at + 1
            at += 1
        args.append(text[current : at - 1].strip())
        found.append((match.start(), at, args))
    return found


def _replace_calls(text: str, function: str, render: Callable[[list[str]], str]) -> str:
    out, last = [], 0
    for start, end, args in _calls(text, function):
        out.append(text[last:start])
        out.append(render(args))
        last = end
    out.append(text[last:])
    return "".join(out)


def _map_name(argument: str) -> str:
    if not re.fullmatch(r"&\w+", argument):
        raise TranslationError(f"a map named by {argument!r}, not &name")
    return argument[1:]


def _lookup(args: list[str]) -> str:
    if len(args) != 2:
        raise TranslationError(f"bpf_map_lookup_elem with {len(args)} arguments")
    return f"{_map_name(args[0])}.lookup({args[1]})"


def _update(args: list[str]) -> str:
    if len(args) != 4:
        raise TranslationError(f"bpf_map_update_elem with {len(args)} arguments")
    method = {"BPF_ANY": "update", "BPF_NOEXIST": "insert"}.get(args[3])
    if method is None:
        raise TranslationError(f"bpf_map_update_elem with flags {args[3]}")
    return f"{_map_name(args[0])}.{method}({args[1]}, {args[2]})"


def translate(
    source: str,
    walk_header: str,
    config: Mapping[str, int],
    max_entries: Mapping[str, int],
    entry_cookies: Sequence[int],
    sched: bool,
    kernel: tuple[int, int] | None = None,
) -> str:
    """bcc's text of the program. config: every field of `cfg`; max_entries: the capacities
    set before load, by map name; entry_cookies: one per runtime copy, on_entry_N's cookie."""
    if _INCLUDE_WALK not in source:
        raise TranslationError("the source does not include pywalk.h")
    text = _bcc_side(_COMMENT.sub("", source.replace(_INCLUDE_WALK, walk_header)))
    seen: set[str] = set()

    def table(match: re.Match[str]) -> str:
        kind = MAP_TYPES.get(match["type"])
        if kind is None:
            raise TranslationError(f"map {match['name']} of type {match['type']}")
        name = match["name"]
        seen.add(name)
        entries = max(1, max_entries.get(name, int(match["entries"])))
        spec = program.maps()[name]
        flags, entries = program.map_shape(spec, entries, kernel or program.kernel_version())
        if flags:
            return (
                f'BPF_F_TABLE("{kind}", {match["key"]}, {match["value"]}, {name}, {entries}, '
                f"{flags});"
            )
        return f'BPF_TABLE("{kind}", {match["key"]}, {match["value"]}, {name}, {entries});'

    text = _MAP_BLOCK.sub(table, text)
    unknown = set(max_entries) - seen
    if unknown:
        raise TranslationError(f"capacities for maps the source lacks: {sorted(unknown)}")
    if 'SEC(".maps")' in text or "__uint(" in text:
        raise TranslationError("a map definition not in the one form translated")
    text = _replace_calls(text, "bpf_map_lookup_elem", _lookup)
    text = _replace_calls(text, "bpf_map_update_elem", _update)
    if re.search(r"\bbpf_map_\w+_elem\(", text):
        raise TranslationError("a map call other than lookup and update")
    text, declared = _CFG_DECLARATION.subn("", text)
    if declared != 1:
        raise TranslationError("the read-only global is not declared as expected")

    def value(match: re.Match[str]) -> str:
        field = match[1]
        if field not in config:
            raise TranslationError(f"no value for cfg.{field}")
        return str(int(config[field]))

    text = _CFG_FIELD.sub(value, text)
    text = _SECTION.sub("", text)
    if "SEC(" in text:
        raise TranslationError("a section annotation not on a line of its own")
    handlers = "".join(
        f"\nint {entry_handler(i)}(struct pt_regs *ctx) {{\n"
        f"    return region_entry(ctx, {cookie}ULL);\n}}\n"
        for i, cookie in enumerate(entry_cookies)
    )
    defines = f"#define PROFKIT_BCC 1\n#define PROFKIT_SCHED {int(sched)}\n"
    return defines + text + handlers


def entry_handler(index: int) -> str:
    """bcc's entry program for runtime copy `index`."""
    return f"on_entry_{index}"
