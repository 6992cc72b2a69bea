"""A Hugging Face Hub on loopback for tests: the two routes a download uses
(the file listing with sizes, and each file's bytes), an optional token it
requires (401 without it, as for a gated model), a rate it may serve files
at (so a download lasts long enough to be watched), and a count of what it
served, so a test can tell a download from a reuse."""

from __future__ import annotations

import collections
import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    repo: str
    files: dict[str, bytes]
    token: str | None = None
    url: str = ""
    served: collections.Counter[str] = field(default_factory=collections.Counter)
    listings: int = 0
    # Files' bytes at this rate (None: as fast as loopback goes).
    bytes_per_second: float | None = None
    # The listing's body as served, when not the one `files` make.
    listing_body: bytes | None = None


def tiny_model_files(*, weight_bytes: int = 16384) -> dict[str, bytes]:
    """A stand-in model: what the simulator's --sim-load-model reads."""
    return {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(),
        "tokenizer.json": b"{}",
        "model.safetensors": bytes(range(256)) * (weight_bytes // 256),
        "original/consolidated.00.pth": b"x" * 1024,
    }


@contextmanager
def serve_hub(hub: FakeHub) -> Iterator[FakeHub]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            if hub.token is not None and self.headers.get("Authorization") != (
                f"Bearer {hub.token}"
            ):
                self._answer(401, b'{"error": "Access to model is restricted."}')
                return
            path = unquote(urlparse(self.path).path)
            listing = f"/api/models/{hub.repo}/revision/"
            resolve = f"/{hub.repo}/resolve/{COMMIT}/"
            if path.startswith(listing):
                hub.listings += 1
                siblings = [{"rfilename": n, "size": len(b)} for n, b in hub.files.items()]
                body = json.dumps({"sha": COMMIT, "siblings": siblings}).encode()
                self._answer(200, hub.listing_body if hub.listing_body is not None else body)
            elif path.startswith(resolve) and path[len(resolve) :] in hub.files:
                name = path[len(resolve) :]
                hub.served[name] += 1
                self._answer(200, hub.files[name], rate=hub.bytes_per_second)
            else:
                self._answer(404, b'{"error": "Repository Not Found"}')

        def _answer(self, code: int, body: bytes, *, rate: float | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            piece = len(body) if rate is None else max(1, int(rate / 10))
            for start in range(0, len(body), piece):
                self.wfile.write(body[start : start + piece])
                if rate is not None:
                    time.sleep(piece / rate)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
