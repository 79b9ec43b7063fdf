"""The emulated SQS hands one visible message to one receive, however many poll at once
(``emulator.aws.sqs_receive``): moto's own receive, without it, gave one message to two threads in
about one round of fifteen below."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from airflow_cloudtrain.emulator.aws.sqs_receive import one_receive_at_a_time

ACCOUNT, REGION = "000000000042", "eu-north-1"  # nobody else's queues in this process


@pytest.fixture()
def backend() -> Iterator[object]:
    from moto.sqs.models import sqs_backends

    assert one_receive_at_a_time(), "moto's SQS code changed: check sqs_receive against it"
    yield sqs_backends[ACCOUNT][REGION]


def test_concurrent_receives_never_share_a_message(backend: object) -> None:
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: the race's window
    try:
        for _ in range(60):
            name = f"q-{uuid.uuid4().hex[:12]}"
            backend.create_queue(name)  # type: ignore[attr-defined]
            for i in range(5):
                backend.send_message(name, f"m{i}")  # type: ignore[attr-defined]
            got: list[str] = []
            go = threading.Event()

            def receive(name: str = name, go: threading.Event = go, got: list[str] = got) -> None:
                go.wait()
                for _ in range(3):
                    got.extend(m.body for m in backend.receive_message(name, 1, 0, 30))  # type: ignore[attr-defined]

            threads = [threading.Thread(target=receive) for _ in range(6)]
            for thread in threads:
                thread.start()
            go.set()
            for thread in threads:
                thread.join()
            backend.delete_queue(name)  # type: ignore[attr-defined]
            assert sorted(got) == [f"m{i}" for i in range(5)], got  # each once
    finally:
        sys.setswitchinterval(switching)


def test_a_long_poll_does_not_hold_up_another_receive(backend: object) -> None:
    empty, full = f"q-{uuid.uuid4().hex[:12]}", f"q-{uuid.uuid4().hex[:12]}"
    for name in (empty, full):
        backend.create_queue(name)  # type: ignore[attr-defined]
    backend.send_message(full, "there")  # type: ignore[attr-defined]
    polled: list[str] = []
    poller = threading.Thread(
        target=lambda: polled.extend(m.body for m in backend.receive_message(empty, 1, 20, 30))  # type: ignore[attr-defined]
    )
    poller.start()
    try:
        got = [m.body for m in backend.receive_message(full, 1, 0, 30)]  # type: ignore[attr-defined]
        assert got == ["there"]
        assert poller.is_alive()  # answered while the 20 s poll still waits
    finally:
        backend.send_message(empty, "wake")  # type: ignore[attr-defined]
        poller.join()
    assert polled == ["wake"]
