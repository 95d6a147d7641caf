"""Run a command inside a fresh child cgroup with a CPU quota, then remove the cgroup.

    python recipes/in_quota.py --cores 0.5 [--on-parent] -- CMD ARGS...

Works on cgroup v1 (cpu and cpuacct controllers) and v2 (cpu.max); needs root.
"""

from __future__ import annotations

import argparse
import sys

from profkit.errors import ProfkitError
from profkit.host.sandbox import run_in_quota


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=float, required=True, help="quota in CPUs, e.g. 0.5")
    parser.add_argument(
        "--on-parent",
        action="store_true",
        help="put the quota on a parent cgroup and run in an unlimited child",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --")
    try:
        return run_in_quota(args.cores, command, on_parent=args.on_parent)
    except ProfkitError as exc:
        print(f"in_quota: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
