"""`watch`'s parsers: target names, Kubernetes labels from cgroup paths, --listen, push names."""

from __future__ import annotations

import os

import pytest

from profkit.errors import UsageError
from profkit.watch import labels as labels_module
from profkit.watch.labels import kubernetes, short_name
from profkit.watch.options import Listen, parse_listen
from profkit.watch.profiles import series_name

POD_UID = "0f3c2a1e-9b8d-4c7a-a1b2-3c4d5e6f7a8b"
CONTAINER = "4f1e" + "ab" * 30


@pytest.mark.parametrize(
    ("cmdline", "name"),
    [
        (("/usr/bin/python3", "-u", "recipes/shm_fanout.py", "--copy", "torch"), "shm_fanout"),
        (("python3.11", "-m", "server.main", "--port", "80"), "main"),
        (("python", "-c", "print(1)"), "python"),
        (("/opt/venv/bin/gunicorn", "app:app"), "gunicorn"),
        ((), "comm"),
    ],
)
def test_short_name(cmdline: tuple[str, ...], name: str) -> None:
    assert short_name(cmdline, "comm") == name


@pytest.mark.parametrize(
    "cgroup",
    [
        # systemd driver, cgroup v2
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        + POD_UID.replace("-", "_")
        + f".slice/cri-containerd-{CONTAINER}.scope\n",
        # cgroupfs driver, cgroup v1
        f"12:cpu,cpuacct:/kubepods/burstable/pod{POD_UID}/{CONTAINER}\n11:memory:/kubepods\n",
    ],
)
def test_kubernetes_labels_from_either_driver(cgroup: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without HOSTNAME in the process's environment the pod is named by its uid.
    monkeypatch.setattr(labels_module.procfs, "read_environ", lambda pid: {})
    labels = kubernetes(os.getpid(), cgroup)
    assert labels == {"namespace": "", "pod": POD_UID, "container": CONTAINER[:12]}
    # The kubelet sets a pod's HOSTNAME to the pod's name, which then names it.
    monkeypatch.setattr(labels_module.procfs, "read_environ", lambda pid: {"HOSTNAME": "web-7f9c"})
    assert kubernetes(os.getpid(), cgroup)["pod"] == "web-7f9c"


def test_not_kubernetes() -> None:
    assert kubernetes(os.getpid(), "0::/system.slice/inference.service\n") == {}
    assert kubernetes(os.getpid(), "0::/profkit-1234abcd\n") == {}


@pytest.mark.parametrize(
    ("text", "listen"),
    [
        ("127.0.0.1:9464", Listen("127.0.0.1", 9464)),
        (":9464", Listen("0.0.0.0", 9464)),
        ("[::1]:9000", Listen("::1", 9000)),
        ("localhost:80", Listen("127.0.0.1", 80)),
    ],
)
def test_listen(text: str, listen: Listen) -> None:
    assert parse_listen(text) == listen


@pytest.mark.parametrize("text", ["9464", "host:9464", "127.0.0.1:", "127.0.0.1:0", "1.2.3:80"])
def test_listen_rejected(text: str) -> None:
    with pytest.raises(UsageError):
        parse_listen(text)


def test_series_name() -> None:
    assert series_name(("srv", "ml", "srv-0", "abc")) == (
        "profkit.cpu{target=srv,namespace=ml,pod=srv-0,container=abc}"
    )
    assert series_name(("a b,c", "", "", "")) == "profkit.cpu{target=a_b_c}"
