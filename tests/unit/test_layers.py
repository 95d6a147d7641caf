"""The packages import only down the pipeline, and no import at load time comes back round.

commands -> capture -> bundle -> host, analysis -> bundle, render -> analysis: a reader of a
bundle never needs the capture (`report` runs without root on another machine), and a module
can be read knowing only what sits below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ..support import ROOT

PACKAGE = ROOT / "profkit"
# What each part of profkit may import besides itself, errors.py and the package's own
# __init__ (the version): everything else is an arrow up the pipeline.
ALLOWED = {
    "__main__": {"cli"},
    "cli": {"commands"},
    "commands": {"capture", "bundle", "analysis", "render", "watch", "host", "autothreads"},
    "watch": {"capture", "bundle", "analysis", "render", "host"},
    "capture": {"bundle", "host"},
    "render": {"analysis", "bundle"},
    "analysis": {"bundle", "host"},
    "bundle": {"host"},
    "autothreads": {"host"},
    "host": set(),
    "errors": set(),
}
SHARED = {"errors", ""}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(module: str, tree: ast.AST, top_level_only: bool) -> set[str]:
    """The profkit modules (or packages) an import statement in the module names."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    nodes = ast.iter_child_nodes(tree) if top_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                # `from .x import y` names module x.y where there is one, else a name in x.
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {name for name in found if name == "profkit" or name.startswith("profkit.")}


def part(module: str) -> str:
    """The part of profkit a module belongs to: its first package, or "" for the package root."""
    return module.split(".")[1] if "." in module else ""


def test_every_part_of_profkit_has_a_rule() -> None:
    assert {part(m) for m in MODULES} - SHARED <= set(ALLOWED)


def test_no_module_imports_up_the_pipeline() -> None:
    wrong = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for target in imported(module, tree, top_level_only=False):
            here, there = part(module), part(target)
            if here != there and there not in SHARED and there not in ALLOWED[here]:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def load_time_graph() -> dict[str, set[str]]:
    """Which modules loading each module loads first. Importing a.b.c runs the packages a and
    a.b first, unless the importer sits inside them already (then they are loading)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        mine = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        edges = set()
        for target in imported(module, tree, top_level_only=True):
            pieces = target.split(".")
            edges |= {".".join(pieces[:i]) for i in range(1, len(pieces) + 1)} - mine
        graph[module] = {e for e in edges if e in MODULES and e != module}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for nxt in sorted(graph[module]):
            if state.get(nxt) == "open":
                cycles.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycle_at_load_time() -> None:
    assert find_cycles(load_time_graph()) == []


def test_the_checks_would_see_an_arrow_up_and_a_cycle() -> None:
    tree = ast.parse("from ..capture.session import capture\nfrom ..host import procfs")
    assert imported("profkit.bundle.write", tree, top_level_only=True) == {
        "profkit.capture.session",
        "profkit.host.procfs",
    }
    # Loading a module in another package runs that package's __init__ first.
    assert "profkit.capture.collectors" in load_time_graph()["profkit.capture.ebpf.collector"]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
