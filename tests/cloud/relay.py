"""A small HTTP relay in front of an emulated API: what a slow network or another endpoint looks like
to our clients. It forwards every request as is, holds the ones matching ``slow`` for ``delay_s``
(matched against "METHOD path X-Amz-Target body"; a describe that takes a while: the window in which other
triggers join its poll group), and
counts what it forwarded and what it answered (which endpoint a connection really points at)."""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class Relay:
    def __init__(self, target: str, slow: str = r"^$", delay_s: float = 0.0) -> None:
        parts = urlsplit(target if "://" in target else f"http://{target}")
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.slow = re.compile(slow)
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.paths: list[str] = []  # what was forwarded: "METHOD path X-Amz-Target body"
        self.answers: list[str] = []  # the same, once its answer went back to the client
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                seen = f"{self.command} {self.path} {target} {body[:300].decode(errors='replace')}"
                with relay.lock:
                    relay.paths.append(seen)
                if relay.slow.search(seen):
                    time.sleep(relay.delay_s)
                upstream = http.client.HTTPConnection(relay.host, relay.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_HEADERS:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with relay.lock:
                    relay.answers.append(seen)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self, pattern: str) -> int:
        """Requests matching ``pattern`` that reached the relay (their answers may still be on the way)."""
        with self.lock:
            return sum(1 for p in self.paths if re.search(pattern, p))

    def answered(self, pattern: str) -> int:
        """Requests matching ``pattern`` whose answer the client was sent: what it has read so far."""
        with self.lock:
            return sum(1 for p in self.answers if re.search(pattern, p))


@contextmanager
def relay(target: str, slow: str = r"^$", delay_s: float = 0.0) -> Iterator[Relay]:
    r = Relay(target, slow, delay_s)
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
