"""What a queue-depth reader is, below its users: the ``DepthReader`` protocol and what it reads.

Each cloud's reader is a hook (``hooks.sqs.SqsDepthReader``: GetQueueAttributes;
``hooks.pubsub.PubSubDepthReader``: Cloud Monitoring's ``subscription/num_undelivered_messages``);
``clouds.registry.depth_reader`` picks one by its queue provider (``PROVIDERS``), and the trigger
and the sensor speak only this protocol (``triggers.queue_depth``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow.exceptions import AirflowException

PROVIDERS = ("sqs", "pubsub")  # the queue providers a reader exists for


class QueueNotFound(AirflowException):
    """The queue does not exist (never read as an empty queue)."""


class DepthNotKnownYet(AirflowException):
    """The queue exists but its depth is not known yet (Cloud Monitoring has no sample of a new
    Pub/Sub subscription for its first minutes). As a ``QueueDepth.error`` it means "unknown, keep
    waiting": never depth 0, never a failure."""


@dataclass(frozen=True)
class QueueDepth:
    """One queue's depth at one poll. ``in_flight``: received but not yet deleted or returned
    (SQS ``ApproximateNumberOfMessagesNotVisible``); ``delayed``: sent with a delay not yet over.
    ``missing``: the queue does not exist. ``error``: this queue's read failed this poll (the other
    queues of the same poll are unaffected), or, a ``DepthNotKnownYet``, its depth is not known yet;
    either way the counts mean nothing (``evaluate_depth`` decides nothing on it).

    On Pub/Sub the backlog (``num_undelivered_messages``, leased messages included) is ``visible``;
    ``in_flight`` and ``delayed`` are 0."""

    queue: str
    visible: int = 0
    in_flight: int = 0
    delayed: int = 0
    missing: bool = False
    error: BaseException | None = None

    def depth(self, count_in_flight: bool = True) -> int:
        """visible + in flight + delayed, or visible only."""
        return self.visible + self.in_flight + self.delayed if count_in_flight else self.visible

    def result(self, count_in_flight: bool = True) -> dict[str, Any]:
        """The sensor's XCom: JSON-safe."""
        return {
            "queue": self.queue,
            "depth": self.depth(count_in_flight),
            "visible": self.visible,
            "in_flight": self.in_flight,
            "delayed": self.delayed,
        }


class DepthReader(ABC):
    """Queue depths for one connection and location (the constructor is each reader's own).

    ``key`` names the poll group (one reader, one async client per group). The sync methods serve
    the sensor's poke on a worker; ``read_async`` is the shared poll's describe in the triggerer and
    must not block the event loop; ``aclose`` ends the async client.
    """

    provider: ClassVar[str]
    key: Hashable

    @abstractmethod
    def resolve(self, queue: str) -> str:
        """The id depths are read by (an SQS queue URL, a Pub/Sub subscription path) for a queue as
        the user named it; raises ``QueueNotFound`` naming it when it does not exist."""

    @abstractmethod
    def read(self, queue: str) -> QueueDepth:
        """One queue's depth now (sync). A missing queue comes back with ``missing=True``; a depth
        not known yet with ``error=DepthNotKnownYet(...)``; a failed call raises."""

    @abstractmethod
    async def read_async(self, queues: list[str]) -> dict[str, QueueDepth]:
        """Every distinct queue's depth, one call each; a per-queue failure is that queue's ``error``."""

    async def aclose(self) -> None:
        """Close the async client, if one was opened."""
        return None
