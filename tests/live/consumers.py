"""The real programs that read profkit's outputs: headless Chromium, speedscope, Go's pprof."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..support import ROOT

if TYPE_CHECKING:  # playwright is imported where a test needs it (need_chromium)
    from playwright.sync_api import Page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SPEEDSCOPE = ROOT / ".cache/node/node_modules/speedscope/dist/release"
GO = shutil.which("go")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def need_chromium() -> None:
    if CHROMIUM is None:
        pytest.skip("no chromium: apt-get install chromium (make test installs it)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("no playwright: pip install -e .[dev]")


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """A static file server on loopback for one test."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return None


@contextlib.contextmanager
def browser_page() -> Iterator[tuple[Page, list[str]]]:
    """A Chromium page and the list of script errors it reports."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: _console(msg, errors))
        try:
            yield page, errors
        finally:
            browser.close()


def _console(message: object, errors: list[str]) -> None:
    # The browser asks every page's server for /favicon.ico; that 404 is not the page's error.
    url = getattr(message, "location", {}).get("url", "")
    if getattr(message, "type", "") == "error" and not url.endswith("/favicon.ico"):
        errors.append(f"console: {getattr(message, 'text', '')} ({url})")


def go_pprof(*args: str) -> str:
    if GO is None:
        pytest.skip("no go toolchain: apt-get install golang-go (make test installs it)")
    result = subprocess.run(
        [GO, "tool", "pprof", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "HOME": "/tmp",
            "PATH": "/usr/bin:/bin",
            "GOFLAGS": "-mod=mod",
            "GOTOOLCHAIN": "local",
        },
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
