"""The docs hold: every relative link, heading anchor, repository path and profkit module named in
README.md and docs/, and every docs/ path (and #anchor) named in a comment or docstring of the
code, exists (scripts/check_docs.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ..support import ROOT


def check_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts" / "check_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_links_and_paths_resolve() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_docs.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def small_tree(root: Path, python: str, c: str = "") -> None:
    (root / "docs" / "results").mkdir(parents=True)
    (root / "docs" / "results" / "cost.md").write_text("# Cost\n\n## Per region\n\nText.\n")
    (root / "docs" / "results" / "run.txt").write_text("ratio 1.000\n")
    (root / "profkit").mkdir()
    (root / "profkit" / "__init__.py").write_text("")
    (root / "profkit" / "rule.py").write_text(python)
    if c:
        (root / "profkit" / "probe.bpf.c").write_text(c)


def test_a_dangling_reference_in_a_comment_or_docstring_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small_tree(
        tmp_path,
        '"""The rule (docs/results/cost.md#per-region; docs/results/gone.txt)."""\n'
        "\n"
        "# Why: docs/results/cost.md#no-such-heading, and docs/results/run.txt.\n"
        "LIMIT = 0.5\n"
        "\n"
        "\n"
        "def f() -> str:\n"
        '    """See docs/removed.md."""\n'
        '    return "docs/in-code-not-a-comment.md"\n',
        "// regions go to an array (docs/results/old-probe-cost.txt)\nint x;\n",
    )
    checker = check_docs()

    assert checker.main(["--root", str(tmp_path)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == [
        "profkit/probe.bpf.c:1: no such path: docs/results/old-probe-cost.txt",
        "profkit/rule.py:1: no such path: docs/results/gone.txt",
        "profkit/rule.py:3: broken reference: docs/results/cost.md#no-such-heading "
        "(no heading '#no-such-heading' in docs/results/cost.md)",
        "profkit/rule.py:8: no such path: docs/removed.md",
    ]


def test_references_that_resolve_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small_tree(
        tmp_path,
        "# The rule; why: docs/results/cost.md#per-region (table: docs/results/run.txt).\n"
        "LIMIT = 0.5\n",
        "/* counted per region: docs/results/cost.md#cost */\nint x;\n",
    )
    assert check_docs().main(["--root", str(tmp_path)]) == 0
    assert "every link and path resolves" in capsys.readouterr().out
