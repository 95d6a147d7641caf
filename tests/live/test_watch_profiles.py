"""`watch`'s profiles: a rolling pprof directory, and pushes to a Pyroscope-style /ingest
endpoint (a loopback server here: no Pyroscope server can be installed), decoded by Go's pprof."""

from __future__ import annotations

import email.parser
import email.policy
import http.server
import re
import threading
import time
import urllib.parse
from pathlib import Path
from typing import TypedDict

import pytest

from ..support import RECIPES
from ..watch_support import agent, free_port
from .conftest import StartRecipe
from .consumers import go_pprof

pytestmark = pytest.mark.root


class Request(TypedDict):
    """One request the server saw; fields by name, as the email parser gives them."""

    path: str
    query: dict[str, str]
    content_type: str
    fields: dict[object, object]


class Ingest(http.server.ThreadingHTTPServer):
    """Records every request: method, path, query, content type and the multipart fields."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", free_port()), _Handler)
        self.requests: list[Request] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        content_type = self.headers.get("Content-Type", "")
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + body
        )
        fields: dict[object, object] = (
            {
                part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                for part in message.iter_parts()
            }
            if message.is_multipart()
            else {}
        )
        url = urllib.parse.urlsplit(self.path)
        assert isinstance(self.server, Ingest)
        self.server.requests.append(
            {
                "path": url.path,
                "query": dict(urllib.parse.parse_qsl(url.query)),
                "content_type": content_type,
                "fields": fields,
            }
        )
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def copy_frame() -> str:
    lines = (RECIPES / "shm_fanout.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "destination.copy_(" in text)
    return f"copy_with_torch (shm_fanout.py:{line})"


def test_profiles_rolled_and_pushed(start_recipe: StartRecipe, tmp_path: Path) -> None:
    recipe = start_recipe("shm_fanout.py", cores=0.5, warmup=1.0)
    server = Ingest()
    server.thread.start()
    profiles = tmp_path / "profiles"
    try:
        with agent(
            "--pid",
            str(recipe.pid),
            "--name",
            "fanout",
            "--interval",
            "1",
            "--profiles",
            str(profiles),
            "--keep",
            "3",
            "--push",
            server.url,
        ) as a:
            a.wait_serving()
            deadline = time.monotonic() + 60
            while len(server.requests) < 6 and time.monotonic() < deadline:
                time.sleep(0.5)
            metrics = a.metrics()  # the sixth is posted: the first five were counted
            code, _ = a.terminate()
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, a.output
    assert len(server.requests) >= 5, a.output
    now = time.time()
    for request in server.requests:
        assert request["path"] == "/ingest"
        query = request["query"]
        assert query["name"] == "profkit.cpu{target=fanout}"
        assert query["format"] == "pprof"
        start, until = int(query["from"]), int(query["until"])
        assert now - 120 < start < until <= now + 1
        assert str(request["content_type"]).startswith("multipart/form-data; boundary=")
        assert set(request["fields"]) == {"profile"}
    pushed = tmp_path / "pushed.pb.gz"
    profile = server.requests[-1]["fields"]["profile"]
    assert isinstance(profile, bytes)
    pushed.write_bytes(profile)
    raw = go_pprof("-raw", str(pushed))
    # The pool's CPU sits under the Python stack that dispatched it.
    assert re.search(rf"{re.escape(copy_frame())}\s*\n\s+\d+: \[openmp pool x2\]", raw) or (
        copy_frame() in raw and "[openmp pool x2]" in raw
    ), raw
    top = go_pprof("-top", "-nodecount=50", str(pushed))
    # The main thread by the name threading gave it (not its comm, "python").
    assert "[python thread MainThread]" in top, top
    pool = re.search(
        r"([\d.]+)(ms|s)\s+[\d.]+%\s+[\d.]+%\s+[\d.]+(?:ms|s)\s+[\d.]+%\s+\[openmp pool x2\]", top
    )
    assert pool and float(pool.group(1)) > 0, top
    pushes = re.search(r"^profkit_profile_pushes_total ([\d.]+)$", metrics, re.M)
    assert pushes and float(pushes.group(1)) >= 5, metrics
    assert re.search(r"^profkit_profile_push_failures_total 0\.0$", metrics, re.M), metrics
    rolled = sorted((profiles / "fanout").glob("*.pb.gz"))
    assert len(rolled) == 3, rolled  # --keep 3, after more windows than that
    assert not list((profiles / "fanout").glob("*.tmp"))
    assert copy_frame() in go_pprof("-raw", str(rolled[-1]))
