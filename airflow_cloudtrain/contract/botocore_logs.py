"""Keep botocore's "Found endpoint ..." / "Found credentials ..." INFO lines out of task logs, for the
clients and sessions we make ourselves only.

botocore logs one of each at INFO for every client it builds (``botocore.configprovider``: "Found
endpoint for ec2 via: environment_global.", ``botocore.credentials``: "Found credentials in
environment variables."). A task that builds a handful of clients, and a test run that builds
hundreds, drown their own lines in them.

Why a filter scoped to our own calls, not ``setLevel(WARNING)`` on those loggers: the loggers are
process-wide and belong to the user's logging setup too. Raising their level from a library would
silence the user's own boto3 clients as well, and undo a level the user set on purpose. Instead
``quiet_botocore()`` marks a block (a ``ContextVar``, so it holds in that thread or task only, and in
``asyncio.to_thread`` calls made from inside it) and a filter installed once on those few loggers
drops their INFO records while a block is marked. Nothing else changes: their levels, handlers and
propagation stay the user's, their warnings and errors pass, the user's clients built outside our
calls still log, and a logger the user set to DEBUG (to see how botocore resolves things) keeps
everything, these lines included.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar

# the loggers that say which endpoint and which credentials a client found
CHATTY_LOGGERS = ("botocore.configprovider", "botocore.credentials", "aiobotocore.credentials")

_ours: ContextVar[bool] = ContextVar("cloudtrain_quiet_botocore", default=False)
_installed = False
_install_lock = threading.Lock()


class _QuietInOurCalls(logging.Filter):
    """Drops INFO records made inside ``quiet_botocore()`` unless the logger is set to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not _ours.get():
            return True
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _install() -> None:
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            for name in CHATTY_LOGGERS:
                logging.getLogger(name).addFilter(_QuietInOurCalls())
            _installed = True


@contextlib.contextmanager
def quiet_botocore() -> Iterator[None]:
    """Within the block (this thread or task), botocore's endpoint and credential INFO lines are not logged."""
    _install()
    token = _ours.set(True)
    try:
        yield
    finally:
        _ours.reset(token)
