"""One SQS receive at a time in moto, so that the emulator never hands one message to two workers.

moto's ``SQSBackend.receive_message`` checks that a message is visible and then marks it received,
with nothing between the two that stops another thread's receive (the server answers each request in
its own thread). Two workers polling one queue under load both got the same message, each with a
fresh lease: a duplicate delivery from a data race, not from anything SQS models. Real standard queues
may deliver a message twice too, rarely; the provider handles that (one outcome per item, the other run
filed as a duplicate: docs/fleet.md), and the tests that show it make the duplicate on purpose. This
keeps the emulator from making one at random under load (a work-queue test failed beside another
suite, docs/testing.md).

The scan-and-mark runs under one lock; a long poll's wait (``Queue.wait_for_messages``) lets it go, so
one worker's 20 s poll never holds up another's receive. Applied only to the moto code it was checked
against (digests below); other versions keep moto's own.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow_cloudtrain.emulator.aws.bigkeys import source_digest

# sha256 of inspect.getsource(...) of the moto 5.2.5 code this module wraps
_CODE = {
    "SQSBackend.receive_message": "065f3e5e7d2144089ce3b5d16d9306243ccd2f3ee11b44beb851292fadb7652f",
    "Queue.wait_for_messages": "58432562ccf2e13ed8841c825dd2614b6e57b71733d1ce9ba6926d38530ba1f1",
}

_receiving = threading.Lock()
_held = threading.local()  # .held: this thread is inside a receive and holds ``_receiving``


def one_receive_at_a_time() -> bool:
    """Wrap moto's receive (idempotent); False when moto's code is not the one checked."""
    from moto.sqs import models

    receive, wait = models.SQSBackend.receive_message, models.Queue.wait_for_messages
    if getattr(receive, "one_at_a_time", False):
        return True
    found: dict[str, Any] = {"SQSBackend.receive_message": receive, "Queue.wait_for_messages": wait}
    if any(source_digest(fn) != _CODE[name] for name, fn in found.items()):
        return False

    def receive_message(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _receiving:
            _held.held = True
            try:
                return receive(self, *args, **kwargs)
            finally:
                _held.held = False

    def wait_for_messages(self: Any, timeout: int) -> None:
        if not getattr(_held, "held", False):
            return wait(self, timeout)
        _receiving.release()  # the long poll's wait: other receives go on meanwhile
        try:
            return wait(self, timeout)
        finally:
            _receiving.acquire()

    receive_message.one_at_a_time = True  # type: ignore[attr-defined]
    models.SQSBackend.receive_message = receive_message  # type: ignore[method-assign]
    models.Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]
    return True
