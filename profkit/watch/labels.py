"""Series labels of a target: its name and, under Kubernetes, its namespace, pod and container.

No pid label: a restarted process (new pid, same command) continues the same series.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..host import procfs
from ..host.cgroup import parse_proc_cgroup

# Pod UIDs in cgroup paths, as the systemd driver (underscores) and cgroupfs write them.
POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# A container id: 64 hex digits, alone or as cri-containerd-ID.scope, docker-ID.scope, crio-ID.
CONTAINER = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")
SERVICE_ACCOUNT_NS = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
LABELS = ("target", "namespace", "pod", "container")


def short_name(cmdline: tuple[str, ...], comm: str) -> str:
    """The command's short name: a Python script's or module's name, else the executable's."""
    if cmdline:
        exe = Path(cmdline[0]).name
        if re.match(r"python[\d.]*$", exe):
            args = list(cmdline[1:])
            while args:
                arg = args.pop(0)
                if arg in ("-m",) and args:
                    return args[0].rsplit(".", 1)[-1] if args[0] != "__main__" else exe
                if arg in ("-c",):
                    return exe
                if arg.startswith("-"):
                    continue
                return Path(arg).stem or exe
        return exe or comm
    return comm


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
    # The service-account token's namespace file, seen through the process's own root.
    try:
        return (Path(f"/proc/{pid}/root") / SERVICE_ACCOUNT_NS).read_text().strip()
    except OSError:
        return ""


def _pod_name(pid: int) -> str:
    # The kubelet sets a pod's hostname (and HOSTNAME) to the pod's name.
    try:
        return procfs.read_environ(pid).get("HOSTNAME", "")
    except OSError:
        return ""


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
