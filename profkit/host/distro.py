"""Which distribution runs here (/etc/os-release), and the command that installs each thing
profkit may miss on it: a fix is only useful in the running distribution's package names.

Only the distributions named below get package commands; any other gets what to install, in
words. Package names were checked against each distribution's archive (docs/install.md).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

OS_RELEASE = (Path("/etc/os-release"), Path("/usr/lib/os-release"))
Family = Literal["debian", "ubuntu", "rhel", "suse", "arch", "other"]
Need = Literal["perf", "bcc", "headers"]
# ID and ID_LIKE values of each family, most specific first: Ubuntu's derivatives name both
# ubuntu and debian in ID_LIKE, and Ubuntu's package names are theirs.
FAMILY_IDS: tuple[tuple[Family, frozenset[str]], ...] = (
    ("ubuntu", frozenset({"ubuntu"})),
    ("debian", frozenset({"debian"})),
    ("rhel", frozenset({"rhel", "fedora", "centos", "rocky", "almalinux", "amzn", "ol"})),
    ("suse", frozenset({"suse", "opensuse", "sles", "opensuse-leap", "opensuse-tumbleweed"})),
    ("arch", frozenset({"arch"})),
)


@dataclass(frozen=True)
class Distro:
    family: Family
    name: str  # PRETTY_NAME, for the reader
    kernel: str  # uname -r, which some package names carry

    def install(self, need: Need) -> str:
        """The command that installs `need` here, or what to install where none is known."""
        k = self.kernel
        commands: dict[Family, dict[Need, str]] = {
            "debian": {
                "perf": "apt-get install linux-perf",
                "bcc": "apt-get install bpfcc-tools python3-bpfcc",
                "headers": f"apt-get install linux-headers-{k}",
            },
            # Ubuntu's perf is built per kernel: a kernel of the node's own has no package.
            "ubuntu": {
                "perf": f"apt-get install linux-tools-{k} (a custom kernel has none: build "
                "perf from its tools/perf)",
                "bcc": "apt-get install bpfcc-tools python3-bpfcc",
                "headers": f"apt-get install linux-headers-{k}",
            },
            "rhel": {
                "perf": "dnf install perf",
                "bcc": "dnf install bcc-tools python3-bcc",
                "headers": f"dnf install kernel-devel-{k}",
            },
            "suse": {
                "perf": "zypper install perf",
                "bcc": "zypper install bcc-tools python3-bcc",
                "headers": "zypper install kernel-devel",
            },
            "arch": {
                "perf": "pacman -S perf",
                "bcc": "pacman -S bcc bcc-tools python-bcc",
                "headers": "pacman -S linux-headers",
            },
        }
        if self.family in commands:
            return commands[self.family][need]
        return {
            "perf": "install perf (Linux's tools/perf) for this kernel",
            "bcc": "install the BPF Compiler Collection with its Python bindings (not PyPI's "
            "bcc, an unrelated package)",
            "headers": f"install the kernel headers of {k}",
        }[need]


def parse_os_release(text: str) -> dict[str, str]:
    """os-release's KEY=value lines, values unquoted (the format is a shell assignment)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        fields[key] = value
    return fields


def family_of(fields: dict[str, str]) -> Family:
    ids = [fields.get("ID", "").lower(), *fields.get("ID_LIKE", "").lower().split()]
    for place in ids:  # ID first: Ubuntu says ID_LIKE=debian but uses its own names
        for family, names in FAMILY_IDS:
            if place in names:
                return family
    return "other"


def current(text: str | None = None, kernel: str | None = None) -> Distro:
    """The running distribution; `text` is an os-release file's content (tests pass one)."""
    if text is None:
        text = ""
        for path in OS_RELEASE:
            try:
                text = path.read_text()
                break
            except OSError:
                continue
    fields = parse_os_release(text)
    name = fields.get("PRETTY_NAME") or fields.get("NAME") or "an unnamed distribution"
    return Distro(family_of(fields), name, kernel or platform.release())


def checkout() -> Path | None:
    """The source checkout profkit runs from, or None for an installed package: only a checkout
    has `make setup` to offer."""
    root = Path(__file__).resolve().parents[2]
    if (root / "Makefile").is_file() and (root / "scripts" / "setup.sh").is_file():
        return root
    return None
