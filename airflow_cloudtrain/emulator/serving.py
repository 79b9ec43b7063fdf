"""One way to run the emulators' loopback servers: in a daemon thread, stopped and joined cleanly."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
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


def json_body(request: Any, invalid: Callable[[str], Exception]) -> dict[str, Any]:
    """A Google REST request's JSON object body ({} when empty); ``invalid(message)`` is the server's
    own 400 error for a body that is not a JSON object."""
    if not request.get_data():
        return {}
    try:
        body = json.loads(request.get_data())
    except ValueError as exc:
        raise invalid("Invalid JSON payload received.") from exc
    if not isinstance(body, dict):
        raise invalid("Invalid JSON payload received.")
    return body
