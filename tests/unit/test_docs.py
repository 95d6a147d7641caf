"""The docs hold: every relative link, heading anchor, repository path and profkit module named in
README.md and docs/ exists (scripts/check_docs.py)."""

from __future__ import annotations

import subprocess
import sys

from ..support import ROOT


def test_docs_links_and_paths_resolve() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_docs.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
