"""The options of `watch` and `top`, parsed once into frozen dataclasses."""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from ..capture.collectors.base import EbpfLoader
from ..errors import UsageError

DEFAULT_LISTEN = "127.0.0.1:9464"
MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 3600.0  # an hour: longer windows are no longer "watching"


@dataclass(frozen=True)
class Selectors:
    """Which processes are targets: any pid, any command line matching, any cgroup under."""

    pids: tuple[int, ...] = ()
    matches: tuple[str, ...] = ()
    cgroups: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.pids or self.matches or self.cgroups)

    def describe(self) -> str:
        parts = [f"pid {p}" for p in self.pids]
        parts += [f"--match {m!r}" for m in self.matches]
        parts += [f"--cgroup {c}" for c in self.cgroups]
        return ", ".join(parts)


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class WatchOptions:
    selectors: Selectors
    interval_s: float = 15.0
    name: str | None = None
    listen: Listen | None = None  # None: no metrics endpoint (`top`)
    profiles_dir: str | None = None
    keep_profiles: int = 240
    push_url: str | None = None
    probes: bool = True  # the OpenMP region probes and the stack walker (eBPF)
    ebpf_loader: EbpfLoader = "auto"
    expire_s: float | None = None  # None: expiry_s(interval_s)


def parse_selectors(
    pids: tuple[int, ...], matches: tuple[str, ...], cgroups: tuple[str, ...]
) -> Selectors:
    for pattern in matches:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"--match {pattern!r} is not a regular expression: {exc}") from exc
    for pid in pids:
        if pid <= 0:
            raise UsageError(f"--pid must be positive, got {pid}")
    selectors = Selectors(
        tuple(pids), tuple(matches), tuple("/" + c.strip("/") if c != "/" else c for c in cgroups)
    )
    if selectors.empty:
        raise UsageError("give at least one target: --pid PID, --match REGEX or --cgroup PATH")
    return selectors


def parse_listen(text: str) -> Listen:
    """HOST:PORT, [IPV6]:PORT or :PORT (every address); the host must be an IP address."""
    bad = UsageError(f"--listen {text!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN})")
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise bad
    port = int(port_text)
    if not 0 < port < 65536:
        raise UsageError(f"--listen port must be 1-65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = host or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise bad from None
        host = "127.0.0.1"
    return Listen(host, port)


def parse_push(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"--push {url!r} is not an http(s) URL of a Pyroscope server")
    return url.rstrip("/")


def check_expire(seconds: float | None, interval_s: float) -> float | None:
    """--expire: finite, at least one interval (a target is looked for once a window) and at
    most a day."""
    if seconds is None:
        return None
    if not (math.isfinite(seconds) and interval_s <= seconds <= 86400):
        raise UsageError(
            f"--expire must be at least the interval ({interval_s:g} s) and at most 86400 s, "
            f"got {seconds:g}"
        )
    return seconds


def check_interval(seconds: float, minimum: float = MIN_INTERVAL_S) -> float:
    """A finite number of seconds in [minimum, MAX_INTERVAL_S], checked while the options are
    parsed: inf or 1e12 would otherwise be taken, and fail only once the port is bound."""
    if not (math.isfinite(seconds) and minimum <= seconds <= MAX_INTERVAL_S):
        raise UsageError(
            f"--interval must be at least {minimum:g} s and at most {MAX_INTERVAL_S:g} s, "
            f"got {seconds:g}"
        )
    return seconds
