"""Long-lived clients that follow their Airflow connection.

A triggerer keeps a poll group's SDK client as long as the group has watchers, which can be days
when runs keep deferring. An edited connection (a new key, another endpoint) must reach that client
without a restart, and a client built from a connection that no longer holds (a test's emulator that
stopped, a rotated key) must not keep failing for minutes. ``Following`` re-reads its connection at
most every ``RECHECK_S`` seconds, and at once on the next use after a failed call, and builds the
client anew when the connection's fields changed. Everything here blocks (reading a connection may
be a call to the API server): use it from worker threads, as the triggers do.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

RECHECK_S = 60.0  # how often a client in use re-reads its connection for a change


def connection_fingerprint(conn_id: str | None) -> str:
    """A digest of the connection's fields: it only tells that one changed (never logged or kept as
    text; the fields include secrets). A connection that cannot be read has its error as digest, so a
    connection that appears later counts as changed. No connection (``aws_conn_id=None``: the SDK's
    own credential chain) never changes."""
    from airflow.providers.common.compat.sdk import BaseHook

    if conn_id is None:
        return "none"
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as err:  # the client build that follows reports it properly
        return f"unreadable:{type(err).__name__}"
    fields = [conn.conn_type, conn.host, conn.schema, conn.login, conn.password, conn.port, conn.extra]
    return hashlib.sha256(json.dumps(fields, default=str).encode()).hexdigest()


class Following(Generic[T]):
    """One client made from connection ``conn_id``, made anew when the connection changed.

    ``make`` builds it (reading the connection itself: a hook); ``finish`` closes it, and those it
    replaced, on ``close``. Thread-safe: the calls of one poll may come from several
    worker threads.

    :param conn_id: the Airflow connection whose changes are followed.
    :param make: builds the client (reads the connection itself: a hook).
    :param finish: closes a client (the current one on ``close``, and those it replaced).
    :param recheck_s: how often the connection is re-read (None: the module's default).
    """

    def __init__(
        self,
        conn_id: str | None,
        make: Callable[[], T],
        finish: Callable[[T], None],
        recheck_s: float | None = None,
    ) -> None:
        self.conn_id = conn_id
        self._make = make
        self._finish = finish
        self._recheck_s = recheck_s
        self._lock = threading.Lock()
        self._client: T | None = None
        self._retired: list[T] = []
        self._digest: str | None = None
        self._checked = 0.0
        self._suspect = False
        self.builds = 0  # how many clients were made (tests)

    def get(self) -> T:
        """The client; re-reads the connection when due (or after a failure), and rebuilds it when
        the connection changed."""
        with self._lock:
            recheck = RECHECK_S if self._recheck_s is None else self._recheck_s
            now = time.monotonic()
            if self._client is not None and not self._suspect and now - self._checked < recheck:
                return self._client
            digest = connection_fingerprint(self.conn_id)
            self._checked, self._suspect = now, False
            if self._client is not None and digest == self._digest:
                return self._client
            if self._client is not None:
                # closed with this one: another thread of the same poll may still be using it
                self._retired.append(self._client)
                self._client = None
            self._client, self._digest = self._make(), digest
            self.builds += 1
            return self._client

    def failed(self) -> None:
        """A call with the client failed: the next ``get`` re-reads the connection first."""
        self._suspect = True

    def close(self) -> None:
        with self._lock:
            clients = [*self._retired, *([self._client] if self._client is not None else [])]
            self._client, self._digest, self._retired = None, None, []
        for client in clients:
            self._finish_quietly(client)

    def _finish_quietly(self, client: T) -> None:
        with contextlib.suppress(Exception):  # a client that will not close cleanly is gone anyway
            self._finish(client)
