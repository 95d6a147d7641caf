#!/usr/bin/env python3
"""Check the documentation's references against the tree (standard library only).

Fails (exit 1, one line per problem) when, in README.md or any Markdown file under docs/:

- a relative link or image (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`,
  `[id]: path`) points at a file or directory that does not exist, or at a heading anchor that
  the target Markdown file does not have (anchors as GitHub makes them from headings);
- a path to a file of this repository (`profkit/...`, and `benchmarks/`, `deploy/`, `docs/`,
  `probes/`, `recipes/`, `scripts/`, `tests/` inside code) does not exist; globs and `{a,b}`
  lists are expanded, a trailing `:LINE` is ignored;
- a module named in code (`profkit.autothreads.apply()`) does not resolve to a module of the
  package, or the name after it is not defined at the top of that module;
- a comment or docstring of the code (Python and C under profkit/, recipes/ and benchmarks/)
  names a `docs/...` path that does not exist, or a `docs/....md#anchor` whose file has no such
  heading: code points at the measurements in docs/results/ instead of quoting them, so a
  pointer must not dangle when a results file is renamed or removed.

Usage: python scripts/check_docs.py [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

# Paths of the package are checked wherever they appear; paths under the other top-level
# folders only inside code, where commands name them.
PACKAGE = "profkit"
CODE_PATH_ROOTS = ("benchmarks", "deploy", "docs", "probes", "recipes", "scripts", "tests")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:[^>]*\s)?(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
# [text](target "title") and ![alt](target); text may hold one level of brackets.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"
)
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
PACKAGE_PATH = re.compile(rf"(?<![\w./~-]){PACKAGE}/[\w./*?{{}},\[\]-]*")
MODULE_REF = re.compile(rf"^{PACKAGE}(?:\.[A-Za-z_]\w*)+(?:\(\))?$")
# The code whose comments and docstrings are checked, and what they may point at: a path under
# docs/, with an optional #anchor (the path ends on a word character or a slash, so that the
# sentence's own full stop or comma is not part of it).
CODE_ROOTS = (PACKAGE, "probes", "recipes", "benchmarks")
CODE_SUFFIXES = (".py", ".c", ".h")
DOCS_REF = re.compile(r"(?<![\w./~-])docs/(?:[\w./-]*[\w/])?(?:#[\w-]+)?")
C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without markup, lower case, punctuation dropped
    (letters, digits, `_`, `-` and spaces kept), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def prose_lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, in_code) for every line: fenced and indented code blocks are code."""
    fence: str | None = None
    previous_blank = True
    in_indented = False
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            yield number, line, True
            previous_blank = False
            continue
        if opening:
            fence = opening.group(1)
            yield number, line, True
            previous_blank = False
            continue
        blank = not line.strip()
        indented = line.startswith("    ") or line.startswith("\t")
        if indented and not blank and (previous_blank or in_indented):
            in_indented = True
            yield number, line, True
        else:
            if not blank:
                in_indented = False
            yield number, line, False
        previous_blank = blank


def anchors_of(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path in cache:
        return cache[path]
    found: set[str] = set()
    counts: dict[str, int] = {}
    lines = list(prose_lines(path.read_text(encoding="utf-8")))

    def add(heading: str) -> None:
        base = slug(heading)
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")

    for i, (_, line, code) in enumerate(lines):
        if code:
            continue
        found.update(HTML_ANCHOR.findall(line))
        atx = ATX.match(line)
        if atx:
            add(atx.group(2))
            continue
        following = lines[i + 1] if i + 1 < len(lines) else None
        if (
            following is not None
            and not following[2]
            and line.strip()
            and SETEXT.match(following[1])
            and not line.lstrip().startswith(("-", "*", "+", "|", ">"))
        ):
            add(line.strip())
    cache[path] = found
    return found


def expand_braces(text: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    out: list[str] = []
    for choice in match.group(1).split(","):
        out += expand_braces(text[: match.start()] + choice + text[match.end() :])
    return out


def path_exists(root: Path, token: str) -> bool:
    token = re.sub(r":\d+(?:-\d+)?$", "", token.rstrip(".,;:)"))  # file:LINE
    for candidate in expand_braces(token):
        candidate = candidate.rstrip("/") or candidate
        if any(ch in candidate for ch in "*?["):
            if not any(root.glob(candidate)):
                return False
        elif not (root / candidate).exists():
            return False
    return True


def top_level_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def module_resolves(root: Path, reference: str) -> bool:
    """profkit.a.b[.name][()] : a.b a module or package of the tree, name defined in it."""
    parts = reference.removesuffix("()").split(".")
    here = root / parts[0]
    if not (here / "__init__.py").exists():
        return False
    module_file = here / "__init__.py"
    for i, part in enumerate(parts[1:], 1):
        if (here / part / "__init__.py").exists():
            here = here / part
            module_file = here / "__init__.py"
            continue
        if (here / f"{part}.py").exists() and here.is_dir():
            module_file = here / f"{part}.py"
            here = here / part  # a module: nothing below it is a file
            continue
        # The rest are attributes: the first must be defined at the module's top level.
        if i == 1:
            return False
        return part in top_level_names(module_file.read_text(encoding="utf-8"))
    return True


def check_file(root: Path, path: Path, cache: dict[Path, set[str]]) -> list[str]:
    problems: list[str] = []
    where = path.relative_to(root)
    for number, line, code in prose_lines(path.read_text(encoding="utf-8")):
        spans = [m.group(2).strip() for m in CODE_SPAN.finditer(line)] if not code else []
        prose = CODE_SPAN.sub("", line) if not code else ""

        # Paths of the package, anywhere; other repository paths inside code.
        code_texts = [line] if code else spans
        tokens: list[str] = []
        for text in code_texts:
            for token in re.split(r"[\s=\"'`]+", text):
                if token.startswith(tuple(f"{d}/" for d in CODE_PATH_ROOTS)):
                    tokens.append(token)
        for text in [*code_texts, prose]:
            tokens += [t.rstrip(".,;:)") for t in PACKAGE_PATH.findall(text)]
        for token in dict.fromkeys(tokens):
            if not path_exists(root, token):
                problems.append(f"{where}:{number}: no such path: {token}")

        for span in spans:
            reference = span.split()[0] if span.split() else ""
            if MODULE_REF.match(reference) and not module_resolves(root, reference):
                problems.append(f"{where}:{number}: no such module or name: {reference}")

        if code:
            continue
        targets = [m.group(1) for m in INLINE_LINK.finditer(prose)]
        definition = REFERENCE_DEF.match(prose)
        if definition:
            targets.append(definition.group(1))
        for raw in targets:
            target = raw.strip("<>")
            if SCHEME.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            file_part = file_part.split("?")[0]
            if file_part.startswith("/"):
                resolved = root / file_part.lstrip("/")
            elif file_part:
                resolved = path.parent / file_part
            else:
                resolved = path
            if not resolved.exists():
                problems.append(f"{where}:{number}: broken link: {target} (no such file)")
                continue
            if (
                anchor
                and resolved.is_file()
                and resolved.suffix == ".md"
                and anchor not in anchors_of(resolved.resolve(), cache)
            ):
                problems.append(
                    f"{where}:{number}: broken link: {target} "
                    f"(no heading '#{anchor}' in {resolved.resolve().relative_to(root)})"
                )
    return problems


def comment_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of the file's comments and docstrings: for Python every
    `#` comment and every string that stands as a statement (docstrings, and strings used as
    comments), for C every `//` and `/* */` comment. A Python file that does not parse (being
    edited) is read whole, code included, so that nothing in it goes unchecked."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if path.suffix != ".py":
        for match in C_COMMENT.finditer(text):
            first = text.count("\n", 0, match.start()) + 1
            for offset, line in enumerate(match.group(0).splitlines()):
                yield first + offset, line
        return
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError, ValueError):
        yield from enumerate(lines, 1)
        return
    for token in tokens:
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            end = node.end_lineno or node.lineno
            for number in range(node.lineno, end + 1):
                yield number, lines[number - 1]


def code_files(root: Path) -> list[Path]:
    return [
        path
        for top in CODE_ROOTS
        if (root / top).is_dir()
        for path in sorted((root / top).rglob("*"))
        if path.suffix in CODE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts
    ]


def check_code_file(root: Path, path: Path, cache: dict[Path, set[str]]) -> list[str]:
    """Every docs/ path a comment or docstring of this file names exists, and so does the
    heading its #anchor names in a Markdown file."""
    problems: list[str] = []
    where = path.relative_to(root)
    for number, line in comment_lines(path):
        for reference in dict.fromkeys(DOCS_REF.findall(line)):
            file_part, _, anchor = reference.partition("#")
            target = root / file_part
            if not target.exists():
                problems.append(f"{where}:{number}: no such path: {file_part}")
            elif (
                anchor
                and target.is_file()
                and target.suffix == ".md"
                and anchor not in anchors_of(target.resolve(), cache)
            ):
                problems.append(
                    f"{where}:{number}: broken reference: {reference} "
                    f"(no heading '#{anchor}' in {file_part})"
                )
    return problems


def markdown_files(root: Path) -> list[Path]:
    files = [root / "README.md"] if (root / "README.md").exists() else []
    return files + sorted((root / "docs").rglob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    cache: dict[Path, set[str]] = {}
    files = markdown_files(root)
    sources = code_files(root)
    problems = [p for f in files for p in check_file(root, f, cache)]
    problems += [p for f in sources for p in check_code_file(root, f, cache)]
    for problem in problems:
        print(problem)
    print(
        f"check_docs: {len(files)} Markdown files, {len(sources)} code files, "
        + (f"{len(problems)} problem(s)" if problems else "every link and path resolves"),
        file=sys.stderr if problems else sys.stdout,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
