"""Series labels of a target: its name and, under Kubernetes, its namespace, pod and container.

No pid label: a restarted process (new pid, same command) continues the same series.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..host import procfs
from ..host.cgroup import parse_proc_cgroup
from ..host.targetfs import MAX_SMALL_FILE_BYTES, read_target_file

# Pod UIDs in cgroup paths, as the systemd driver (underscores) and cgroupfs write them.
POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# A container id: 64 hex digits, alone or as cri-containerd-ID.scope, docker-ID.scope, crio-ID.
CONTAINER = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")
SERVICE_ACCOUNT_NS = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
LABELS = ("target", "namespace", "pod", "container")


# What a label may hold: a name, never argument text. The first character keeps out ".", ".."
# and options ("-W"); the length is bounded since a label is also a profile directory's name.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MAX_NAME = 64
PYTHON_EXE = re.compile(r"python[\d.]*$")
# CPython's options that take an argument (attached, -Wignore, or the next one, -W ignore).
PY_SHORT_WITH_ARG = frozenset("cmWX")
PY_LONG_WITH_ARG = frozenset({"--check-hash-based-pycs"})


def safe_name(text: str) -> str | None:
    """text if it is a short name made of safe characters (cut to MAX_NAME), else None."""
    return text[:MAX_NAME] if SAFE_NAME.fullmatch(text) else None


def short_name(cmdline: tuple[str, ...], comm: str) -> str:
    """The command's short name: a Python script's or module's name, else the executable's.

    argv is the process's own to rewrite (`exec -a "worker --api-key=..."`, setproctitle): a
    part that is not a plain name is never published; the kernel's comm stands in for argv[0].
    """
    fallback = safe_name(comm) or "unknown"
    exe = (safe_name(Path(cmdline[0]).name) if cmdline else None) or fallback
    if not PYTHON_EXE.match(exe):
        return exe
    return _python_main(cmdline[1:], exe)


def _python_main(args: tuple[str, ...], exe: str) -> str:
    """The script's or module's name in a Python command line, as CPython parses its options;
    exe for -c, stdin or a name that is not a plain one."""
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if arg == "-" or not arg.startswith("-"):
            i -= 1
            break
        if arg.startswith("--"):
            name, eq, _ = arg.partition("=")
            i += name in PY_LONG_WITH_ARG and not eq
            continue
        for at, flag in enumerate(arg[1:], 2):
            if flag not in PY_SHORT_WITH_ARG:
                continue
            value = arg[at:]
            if not value:
                value = args[i] if i < len(args) else ""
                i += 1
            if flag == "c":
                return exe
            if flag == "m":
                parts = value.split(".")
                if parts[-1] == "__main__":
                    parts.pop()  # `-m package.__main__` runs the package
                return (safe_name(parts[-1]) if parts else None) or exe
            break  # -W and -X: the rest of the argument, or the next one, is their value
    if i >= len(args) or args[i] == "-":
        return exe
    return safe_name(Path(args[i]).stem) or exe


def kubernetes(pid: int, cgroup_text: str) -> dict[str, str]:
    """namespace, pod and container of a process whose cgroup path shows a pod; else {}."""
    paths = parse_proc_cgroup(cgroup_text)
    path = paths.get("") or paths.get("cpu") or next(iter(paths.values()), "")
    pod = POD.search(path)
    if not pod:
        return {}
    container = CONTAINER.search(path.rstrip("/"))
    labels = {
        "namespace": _namespace(pid),
        "pod": _pod_name(pid) or pod.group(1).replace("_", "-"),
        "container": container.group(1)[:12] if container else "",
    }
    return labels


def _namespace(pid: int) -> str:
    # The service-account token's namespace file, read inside the process's own root and as
    # the process could: a link or a FIFO planted there gives no label, never a host file.
    try:
        raw = read_target_file(pid, SERVICE_ACCOUNT_NS, MAX_SMALL_FILE_BYTES)
    except OSError:
        return ""
    name = raw.decode(errors="replace").strip()
    # A Kubernetes namespace is a DNS label; anything else is not one.
    return name if DNS_LABEL.fullmatch(name) else ""


def _pod_name(pid: int) -> str:
    # The kubelet sets a pod's hostname (and HOSTNAME) to the pod's name; the environment is
    # the process's own to set, so only a name a pod could have (a DNS subdomain) is taken.
    try:
        name = procfs.read_environ(pid).get("HOSTNAME", "")
    except OSError:
        return ""
    return name if len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name) else ""


def labels_of(pid: int, cmdline: tuple[str, ...], comm: str, name: str | None) -> tuple[str, ...]:
    try:
        cgroup_text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        cgroup_text = ""
    kube = kubernetes(pid, cgroup_text)
    return (
        name or short_name(cmdline, comm),
        kube.get("namespace", ""),
        kube.get("pod", ""),
        kube.get("container", ""),
    )
