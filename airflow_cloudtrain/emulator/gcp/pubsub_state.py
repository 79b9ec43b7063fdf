"""The emulated Pub/Sub's state: topics, subscriptions, and each subscription's unacknowledged messages
with their leases, on the wall clock. No HTTP here (``pubsub.py`` serves it).

Nothing runs in the background: a lease is a deadline, compared with the clock whenever state is read,
and dead-lettering happens in ``_sweep`` (called under the lock by every request and helper), so a
message whose last allowed lease ran out is on the dead-letter topic by the next time anyone looks.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_cloudtrain.emulator.gcp.gce_api import PROJECT_ID
from airflow_cloudtrain.emulator.gcp.rest import GoogleError

DELETED_TOPIC = "_deleted-topic_"
_NAME = re.compile(r"[A-Za-z][-A-Za-z0-9_.~+%]{2,254}")


def rfc3339(t: float) -> str:
    """Pub/Sub and Monitoring write UTC with a "Z" (microseconds here; the real API writes up to nanos)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class PubSubError(GoogleError):
    """An error in Google's JSON shape (``error.code``/``message``/``status``/``details``)."""

    def __init__(self, code: int, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(code, message, details=details)


def invalid(message: str) -> PubSubError:
    return PubSubError(400, message)


def int_field(body: dict[str, Any], field: str) -> int:
    """An integer field of a JSON body (0 when omitted: proto3 JSON leaves zeros out); else a 400."""
    try:
        return int(body.get(field) or 0)
    except (TypeError, ValueError) as exc:
        raise invalid(f"Invalid value at '{field}' ({body.get(field)!r}): not an integer.") from exc


def not_found(name: str) -> PubSubError:
    return PubSubError(404, f"Resource not found (resource={name.rsplit('/', 1)[-1]}).")


def already_exists(name: str) -> PubSubError:
    return PubSubError(409, f"Resource already exists in the project (resource={name.rsplit('/', 1)[-1]}).")


def _topic(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": dict(labels), "state": "ACTIVE"}


@dataclass
class Message:
    id: str
    data: str  # base64, as published
    attributes: dict[str, str]
    publish_time: float
    ordering_key: str = ""

    def show(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "data": self.data,
            "messageId": self.id,
            "publishTime": rfc3339(self.publish_time),
        }
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        if self.ordering_key:
            out["orderingKey"] = self.ordering_key
        return out


@dataclass
class Pending:
    """One message in one subscription, until acknowledged (or dead-lettered)."""

    message: Message
    attempts: int = 0  # deliveries so far
    ack_id: str | None = None  # the current lease's; None: never delivered, or nacked
    lease_until: float = 0.0

    def deliverable(self, now: float) -> bool:
        return self.ack_id is None or now >= self.lease_until


@dataclass
class Subscription:
    name: str
    topic: str
    ack_deadline_s: int
    labels: dict[str, str]
    retention: str
    dead_letter_topic: str | None = None
    max_attempts: int = 0
    pending: dict[str, Pending] = field(default_factory=dict)  # message id -> entry, in publish order

    def show(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "topic": self.topic,
            "pushConfig": {},
            "ackDeadlineSeconds": self.ack_deadline_s,
            "messageRetentionDuration": self.retention,
            "labels": dict(self.labels),
            "state": "ACTIVE",
        }
        if self.dead_letter_topic:
            out["deadLetterPolicy"] = {
                "deadLetterTopic": self.dead_letter_topic,
                "maxDeliveryAttempts": self.max_attempts,
            }
        return out


class PubSubState:
    """Topics and subscriptions of one project, behind one lock (and a condition that wakes waiting
    pulls when something may have become deliverable)."""

    deadline_scale: float = 1.0  # tests: a lease of N seconds lasts N * scale

    def __init__(self, project: str) -> None:
        self.project = project
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._topics: dict[str, dict[str, str]] = {}  # full name -> labels
        self._subs: dict[str, Subscription] = {}  # full name -> subscription
        self._acks: dict[str, tuple[str, str]] = {}  # ack id -> (subscription, message id)
        self._ids = itertools.count(10**15 + secrets.randbelow(10**15))

    # --- names ----------------------------------------------------------------------------------

    def _full(self, kind: str, name: str) -> str:
        """``projects/<p>/<kind>/<name>`` for a short or full name, checked as the API checks it."""
        if "/" not in name:
            name = f"projects/{self.project}/{kind}/{name}"
        parts = name.split("/")
        if len(parts) != 4 or parts[0] != "projects" or parts[2] != kind:
            raise invalid(f"Invalid [{kind}] name: (name={name})")
        if not PROJECT_ID.fullmatch(parts[1]):  # any project id is served (``project``: short names')
            raise PubSubError(
                404, f"Requested project not found or user does not have access to it (project={parts[1]})."
            )
        if not _NAME.fullmatch(parts[3]) or parts[3].startswith("goog"):
            raise invalid(f"Invalid [{kind}] name: (name={name})")
        return name

    def _sub(self, name: str) -> Subscription:
        full = self._full("subscriptions", name)
        if full not in self._subs:
            raise not_found(full)
        return self._subs[full]

    # --- topics ---------------------------------------------------------------------------------

    def create_topic(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        full = self._full("topics", name)
        with self._lock:
            if full in self._topics:
                raise already_exists(full)
            self._topics[full] = dict(labels)
            return _topic(full, labels)

    def get_topic(self, name: str) -> dict[str, Any]:
        full = self._full("topics", name)
        with self._lock:
            if full not in self._topics:
                raise not_found(full)
            return _topic(full, self._topics[full])

    def delete_topic(self, name: str) -> None:
        """Its subscriptions stay, detached: their ``topic`` reads ``_deleted-topic_``."""
        full = self._full("topics", name)
        with self._lock:
            if self._topics.pop(full, None) is None:
                raise not_found(full)
            for sub in self._subs.values():
                if sub.topic == full:
                    sub.topic = DELETED_TOPIC

    def publish(self, name: str, messages: list[dict[str, Any]]) -> list[str]:
        full = self._full("topics", name)
        if not messages:
            raise invalid("The request contained no messages.")
        for m in messages:
            if not m.get("data") and not m.get("attributes"):
                raise invalid("Some messages are empty: a message needs data or attributes.")
            try:
                base64.b64decode(m.get("data") or "", validate=True)
            except (binascii.Error, ValueError) as exc:
                raise invalid("Invalid data in message: not base64.") from exc
        with self._cond:
            if full not in self._topics:
                raise not_found(full)
            now = time.time()
            out = [
                self._deliver_to_topic(
                    full, m.get("data") or "", m.get("attributes") or {}, now, m.get("orderingKey", "")
                )
                for m in messages
            ]
            self._cond.notify_all()
            return out

    def _deliver_to_topic(
        self, topic: str, data: str, attributes: dict[str, str], now: float, ordering_key: str = ""
    ) -> str:
        """A new message on ``topic``: one copy for each of its subscriptions existing now."""
        message = Message(str(next(self._ids)), data, dict(attributes), now, ordering_key)
        for sub in self._subs.values():
            if sub.topic == topic:
                sub.pending[message.id] = Pending(message)
        return message.id

    def list_topics(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_topic(n, labels) for n, labels in sorted(self._topics.items())]

    def topic_subscriptions(self, name: str) -> list[str]:
        full = self._full("topics", name)
        with self._lock:
            if full not in self._topics:
                raise not_found(full)
            return sorted(s.name for s in self._subs.values() if s.topic == full)

    # --- subscriptions --------------------------------------------------------------------------

    def create_subscription(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        full = self._full("subscriptions", name)
        if not body.get("topic"):
            raise invalid("The topic field is required.")
        topic = self._full("topics", body["topic"])
        deadline = int_field(body, "ackDeadlineSeconds") or 10  # 0 (omitted in JSON) means the default
        if not 10 <= deadline <= 600:
            raise invalid(f"Invalid ack deadline given: {deadline} seconds. It must be between 10 and 600.")
        policy = body.get("deadLetterPolicy") or {}
        dlt, attempts = policy.get("deadLetterTopic") or None, int_field(policy, "maxDeliveryAttempts") or 5
        if policy and not 5 <= attempts <= 100:
            raise invalid(
                f"Invalid max_delivery_attempts: {attempts}. It must be between 5 and 100, inclusive."
            )
        dlt = self._full("topics", dlt) if dlt else None
        with self._lock:
            if full in self._subs:
                raise already_exists(full)
            for needed in (topic, dlt):
                if needed and needed not in self._topics:
                    raise not_found(needed)
            sub = Subscription(
                full,
                topic,
                deadline,
                dict(body.get("labels") or {}),
                body.get("messageRetentionDuration") or "604800s",
                dlt,
                attempts if dlt else 0,
            )
            self._subs[full] = sub
            return sub.show()

    def get_subscription(self, name: str) -> dict[str, Any]:
        with self._lock:
            return self._sub(name).show()

    def delete_subscription(self, name: str) -> None:
        with self._lock:
            sub = self._subs.pop(self._sub(name).name)
            for mid in list(sub.pending):
                self._forget(sub, mid)

    def list_subscriptions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._subs[n].show() for n in sorted(self._subs)]

    # --- delivery -------------------------------------------------------------------------------

    def _sweep(self, now: float) -> None:
        """Dead-letter every message that has had all its deliveries and is deliverable again."""
        for sub in list(self._subs.values()):
            if not sub.dead_letter_topic or sub.dead_letter_topic not in self._topics:
                continue  # (a deleted dead-letter topic: the message keeps being delivered)
            for mid, p in list(sub.pending.items()):
                if p.attempts >= sub.max_attempts and p.deliverable(now):
                    attrs = {
                        **p.message.attributes,
                        "CloudPubSubDeadLetterSourceSubscription": sub.name.rsplit("/", 1)[-1],
                        "CloudPubSubDeadLetterSourceSubscriptionProject": sub.name.split("/")[1],
                        "CloudPubSubDeadLetterSourceDeliveryCount": str(p.attempts),
                        "CloudPubSubDeadLetterSourceTopicPublishTime": rfc3339(p.message.publish_time),
                    }
                    self._deliver_to_topic(sub.dead_letter_topic, p.message.data, attrs, now)
                    self._forget(sub, mid)

    def _forget(self, sub: Subscription, mid: str) -> None:
        p = sub.pending.pop(mid)
        if p.ack_id:
            self._acks.pop(p.ack_id, None)

    def _take(self, sub: Subscription, max_messages: int, now: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in sub.pending.values():
            if len(out) >= max_messages:
                break
            if not p.deliverable(now):
                continue
            if p.ack_id:
                self._acks.pop(p.ack_id, None)  # the old lease's id is dead from now on
            p.attempts += 1
            p.ack_id = secrets.token_urlsafe(24)
            p.lease_until = now + sub.ack_deadline_s * self.deadline_scale
            self._acks[p.ack_id] = (sub.name, p.message.id)
            got: dict[str, Any] = {"ackId": p.ack_id, "message": p.message.show()}
            if sub.dead_letter_topic:
                got["deliveryAttempt"] = p.attempts
            out.append(got)
        return out

    def pull(self, name: str, max_messages: int, wait_s: float) -> list[dict[str, Any]]:
        """Up to ``max_messages`` deliverable messages, leased; waits up to ``wait_s`` for one."""
        if max_messages <= 0:
            raise invalid("max_messages must be a positive number.")
        until = time.monotonic() + wait_s
        with self._cond:
            while True:
                now = time.time()
                self._sweep(now)
                got = self._take(self._sub(name), max_messages, now)
                left = until - time.monotonic()
                if got or left <= 0:
                    return got
                self._cond.wait(min(left, 0.05))  # leases run out without anyone notifying

    def _leases(self, name: str, ack_ids: list[str], now: float) -> tuple[Subscription, list[Pending]]:
        """The live leases among ``ack_ids``. The caller handles them, then calls ``_refuse`` with the
        others (expired, superseded or unknown): one bad id does not undo the good ones."""
        sub = self._sub(name)
        if not ack_ids:
            raise invalid("No ack ids specified.")
        live = []
        for ack_id in ack_ids:
            where = self._acks.get(ack_id)
            p = sub.pending.get(where[1]) if where and where[0] == sub.name else None
            if p is not None and p.ack_id == ack_id and now < p.lease_until:
                live.append(p)
        return sub, live

    @staticmethod
    def _refuse(bad: list[str]) -> None:
        """400 INVALID_ARGUMENT naming the bad ids in an ErrorInfo (as exactly-once subscriptions do)."""
        if bad:
            info = {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "INVALID_ACK_ID",
                "domain": "pubsub.googleapis.com",
                "metadata": {a: "PERMANENT_FAILURE_INVALID_ACK_ID" for a in bad},
            }
            msg = f"You have passed an invalid ack ID to the service (ack_id={bad[0]})."
            raise PubSubError(400, msg, [info])

    def acknowledge(self, name: str, ack_ids: list[str]) -> None:
        with self._cond:
            now = time.time()
            self._sweep(now)
            sub, live = self._leases(name, ack_ids, now)
            good = {p.ack_id for p in live}
            for p in live:
                self._forget(sub, p.message.id)
            self._refuse([a for a in ack_ids if a not in good])

    def modify_ack_deadline(self, name: str, ack_ids: list[str], seconds: int) -> None:
        """0 nacks (deliverable at once; the next delivery is one more attempt); >0 sets the lease to
        run out ``seconds`` from now."""
        if not 0 <= seconds <= 600:
            raise invalid(f"Invalid ack deadline given: {seconds} seconds. It must be between 0 and 600.")
        with self._cond:
            now = time.time()
            self._sweep(now)
            _, live = self._leases(name, ack_ids, now)
            good = {p.ack_id for p in live}
            for p in live:
                if seconds == 0:
                    self._acks.pop(p.ack_id or "", None)
                    p.ack_id, p.lease_until = None, now
                else:
                    p.lease_until = now + seconds * self.deadline_scale
            if seconds == 0 and live:
                self._cond.notify_all()
            self._refuse([a for a in ack_ids if a not in good])

    # --- inspection (tests, Monitoring) ---------------------------------------------------------

    def subscription_backlog(self, name: str) -> int | None:
        """Messages not yet acknowledged (waiting and leased), as ``num_undelivered_messages`` counts
        them; None when the subscription does not exist."""
        stats = self.subscription_stats(name)
        return None if stats is None else stats[0]

    def subscription_leased(self, name: str) -> int | None:
        """Messages under a lease that has not run out (pulled, neither acked nor nacked); None when
        the subscription does not exist."""
        with self._lock:
            now = time.time()
            sub = self._subs.get(self._full("subscriptions", name))
            return None if sub is None else sum(not p.deliverable(now) for p in sub.pending.values())

    def subscription_stats(self, name: str) -> tuple[int, int] | None:
        """(unacknowledged messages, seconds since the oldest of them was published, 0 with none);
        None when the subscription does not exist."""
        with self._lock:
            now = time.time()
            self._sweep(now)
            sub = self._subs.get(self._full("subscriptions", name))
            if sub is None:
                return None
            oldest = min((p.message.publish_time for p in sub.pending.values()), default=now)
            return len(sub.pending), int(now - oldest)

    def exists(self, kind: str, name: str) -> bool:
        """``exists("topic", "t")`` / ``exists("subscription", "projects/p/subscriptions/s")``."""
        plural = {"topic": "topics", "subscription": "subscriptions"}[kind]
        full = self._full(plural, name)
        with self._lock:
            return full in (self._topics if plural == "topics" else self._subs)

    def subscription_names(self) -> list[str]:
        with self._lock:
            return sorted(self._subs)
