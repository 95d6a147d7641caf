"""Finding the external tools profkit drives, and their versions.

Search order, documented in docs/install.md: an explicit PROFKIT_<TOOL> variable, the directory of
the running interpreter (a virtualenv's bin/ holds py-spy), then PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MINIMUM_VERSIONS = {"py-spy": (0, 4, 0), "perf": (5, 0, 0)}


@dataclass(frozen=True)
class Tool:
    name: str
    path: str | None
    version: tuple[int, ...] | None

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else "unknown"

    @property
    def usable(self) -> bool:
        minimum = MINIMUM_VERSIONS.get(self.name)
        return self.path is not None and (minimum is None or (self.version or (0,)) >= minimum)


def find_binary(name: str) -> str | None:
    override = os.environ.get("PROFKIT_" + name.upper().replace("-", "_"))
    if override:
        return override if os.access(override, os.X_OK) else None
    beside = Path(sys.executable).parent / name
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def _version(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out.stdout + out.stderr)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def find_tool(name: str) -> Tool:
    path = find_binary(name)
    return Tool(name, path, _version(path) if path else None)
