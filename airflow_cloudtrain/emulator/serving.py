"""One way to run the emulators' loopback servers: in a daemon thread, stopped and joined cleanly."""

from __future__ import annotations

import threading
from typing import Any


class InThread:
    """A started socketserver-style server (``serve_forever``/``shutdown``) and its thread."""

    def __init__(self, server: Any, name: str) -> None:
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://{self.server.server_address[0]}:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
