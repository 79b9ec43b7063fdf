"""The emulated Pub/Sub (v1 REST) and Cloud Monitoring's ``projects.timeSeries.list`` (v3 REST) for the
subscription metrics, on one local HTTP server; the state is ``pubsub_state``.

The real GAPIC clients talk to it unchanged over REST (streaming pull is gRPC-only, not served)::

    server = PubSubServer(); endpoint = server.start()      # "http://127.0.0.1:PORT"
    pubsub_v1.SubscriberClient(**pubsub_client_kwargs(endpoint))    # the same for PublisherClient
    # == SubscriberClient(transport="rest", credentials=AnonymousCredentials(),
    #                     client_options={"api_endpoint": endpoint})

Over REST, api_core maps an error by its HTTP status alone: 409 raises ``Conflict``, 400 ``BadRequest``,
429 ``TooManyRequests`` (gRPC's ``AlreadyExists``, ``InvalidArgument``, ``ResourceExhausted`` are their
subclasses, so code that catches the REST classes works on both); 404 is ``NotFound`` either way.

Monitoring: ``google-cloud-monitoring`` 2.32 ships no REST transport (``MetricServiceClient(transport=
"rest")`` is a KeyError), so its GAPIC client cannot reach any HTTP emulator; the API's REST surface is
served here as the real one is, ``GET /v3/projects/<p>/timeSeries?filter=...&interval.endTime=...``,
which ``googleapiclient.discovery.build("monitoring", "v3", client_options={"api_endpoint": endpoint})``
or any HTTP client reads.

What is mimicked, and why (a work queue built on it must meet what it meets in production):

* Topics and subscriptions: create (409 ALREADY_EXISTS), get, delete (404 NOT_FOUND), list; names are
  checked as the API checks them (400); any project is served, as moto serves any account (each lists
  and measures its own; ``project`` is the one short names mean), a malformed project id is 404.
  A deleted topic's subscriptions stay,
  their ``topic`` then reads ``_deleted-topic_``. A message goes to every subscription of its topic
  that exists when it is published.
* ``ackDeadlineSeconds`` 10..600 (omitted: 10), ``deadLetterPolicy.maxDeliveryAttempts`` 5..100
  (omitted: 5), the dead-letter topic must exist; else 400 INVALID_ARGUMENT / 404.
* Pull leases what it returns for the ack deadline, with a new ``ackId`` per delivery and
  ``deliveryAttempt`` (only with a dead-letter policy). A lease that runs out, or a
  ``modifyAckDeadline`` of 0 (nack), makes the message deliverable again, one attempt more. Pull with
  nothing deliverable answers ``{}`` after waiting up to ``pull_wait_s`` (0.5 s; none with
  ``returnImmediately``). A message whose ``maxDeliveryAttempts`` deliveries are spent goes to the
  dead-letter topic (with the ``CloudPubSubDeadLetterSource*`` attributes) instead of a next delivery.
* ``acknowledge`` / ``modifyAckDeadline`` with an ackId whose lease ran out, was superseded by a
  redelivery, or is unknown: the good ids take effect, then HTTP 400 INVALID_ARGUMENT with an
  ErrorInfo whose ``metadata`` maps each bad id to ``PERMANENT_FAILURE_INVALID_ACK_ID``. (Stricter than
  a subscription without exactly-once delivery, where the real service accepts a late ack silently
  and redelivers; code must survive both.)
* Monitoring: ``metric.type = "pubsub.googleapis.com/subscription/num_undelivered_messages"`` (or
  ``.../oldest_unacked_message_age``) with optional ``resource.type``, ``resource.labels.
  subscription_id`` / ``project_id`` clauses joined by AND; one GAUGE INT64 point, read now, per
  matching subscription. A subscription that does not exist has no series: the answer is ``{}``, as
  the real API answers, never a 0. ``interval.endTime`` is required (400), as on the real API.
* Throttling (``throttle.set(rate, api)``, ``emulator.faults``; services ``"pubsub"`` and
  ``"monitoring"``, operations below): HTTP 429 RESOURCE_EXHAUSTED with an ErrorInfo
  RATE_LIMIT_EXCEEDED, before anything is done. Over REST the client raises ``TooManyRequests``,
  which the GAPIC default retries (keyed on ``ResourceExhausted``) do not retry.
* Requests are counted per operation (``topics.create``, ``topics.get``, ``topics.delete``,
  ``topics.list``, ``topics.publish``, ``topics.subscriptions.list``, ``subscriptions.create|get|delete|
  list|pull|acknowledge|modifyAckDeadline``, ``timeSeries.list``; ``throttled:<op>`` for the refused),
  except the emulator's own (user agent with ``cloudtrain-emulator``).

Helpers: ``subscription_backlog(name) -> int | None`` (what num_undelivered_messages reads; None: no
such subscription), ``subscription_leased(name) -> int | None`` (those under a live lease),
``exists("topic" | "subscription", name)``, ``subscription(name) -> dict | None`` (the REST
resource); names short or full. ``deadline_scale`` (tests): a lease of N seconds lasts
N * scale seconds, so the 10 s minimum deadline can run out in 0.5 s.

Not emulated: streaming pull, push subscriptions, ordering-key delivery order, filters on
subscriptions, exactly-once delivery, retention expiry, seek/snapshots, schemas, IAM, patch; and the
real metric's sampling delay (it lags by a minute or more and is absent for a new subscription).
"""

from __future__ import annotations

import re
import time
from typing import Any

from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.faults import Throttle
from airflow_cloudtrain.emulator.gcp.gce_api import PROJECT_ID
from airflow_cloudtrain.emulator.gcp.pubsub_state import PubSubError, PubSubState, int_field, invalid, rfc3339
from airflow_cloudtrain.emulator.gcp.rest import GoogleRestServer

__all__ = ["PubSubServer", "pubsub_client_kwargs"]

BACKLOG = "pubsub.googleapis.com/subscription/num_undelivered_messages"
OLDEST_AGE = "pubsub.googleapis.com/subscription/oldest_unacked_message_age"
_METRICS = {BACKLOG: 0, OLDEST_AGE: 1}  # metric -> its place in PubSubState.subscription_stats
_CLAUSE = re.compile(r"""\s*([\w.]+)\s*=\s*("(?:[^"\\]|\\.)*"|'[^']*'|[^\s"'()]+)\s*""")
_AND = re.compile(r"\s+AND\s+", re.IGNORECASE)


def pubsub_client_kwargs(endpoint: str) -> dict[str, Any]:
    """Keyword arguments that point a ``google.pubsub_v1`` Publisher/SubscriberClient at the emulator."""
    from google.auth.credentials import AnonymousCredentials

    return {
        "transport": "rest",
        "credentials": AnonymousCredentials(),
        "client_options": {"api_endpoint": endpoint},
    }


def parse_filter(text: str) -> dict[str, str]:
    """``a = "x" AND b = 'y'`` -> ``{"a": "x", "b": "y"}``; ``resource.label.k`` reads as
    ``resource.labels.k``. Anything else (OR, NOT, functions) is a 400: better than a silent misread."""
    out: dict[str, str] = {}
    for part in _AND.split(text.strip()):
        m = _CLAUSE.fullmatch(part)
        if not m:
            raise invalid(f'Field filter had an invalid value of "{text}": unsupported expression.')
        key, value = m.group(1).replace(".label.", ".labels."), m.group(2)
        out[key] = value[1:-1] if value[:1] in "\"'" else value
    return out


class PubSubServer(GoogleRestServer, PubSubState):
    """Pub/Sub v1 + Monitoring timeSeries.list on 127.0.0.1 (random port) in a daemon thread; module doc.
    Requests take the shared pipeline (``rest``)."""

    service = "pubsub"
    services = {"timeSeries.list": "monitoring"}
    thread_name = "pubsub-emulator"

    pull_wait_s: float = 0.5  # how long a pull with nothing deliverable waits before answering {}

    def __init__(
        self,
        project: str = "cloudtrain-emulated",
        throttle: Throttle | None = None,
        deadline_scale: float = 1.0,
    ) -> None:
        PubSubState.__init__(self, project)
        p, t, sub = "/v1/projects/<project>", "/v1/<path:topic>", "/v1/<path:sub>"
        rules = [
            Rule(f"{p}/topics", endpoint="topics.list", methods=["GET"]),
            Rule(f"{p}/topics/<name>", endpoint="topics.create", methods=["PUT"]),
            Rule(f"{p}/topics/<name>", endpoint="topics.get", methods=["GET"]),
            Rule(f"{p}/topics/<name>", endpoint="topics.delete", methods=["DELETE"]),
            Rule(f"{p}/topics/<name>/subscriptions", endpoint="topics.subscriptions.list", methods=["GET"]),
            Rule(f"{t}:publish", endpoint="topics.publish", methods=["POST"]),
            Rule(f"{p}/subscriptions", endpoint="subscriptions.list", methods=["GET"]),
            Rule(f"{p}/subscriptions/<name>", endpoint="subscriptions.create", methods=["PUT"]),
            Rule(f"{p}/subscriptions/<name>", endpoint="subscriptions.get", methods=["GET"]),
            Rule(f"{p}/subscriptions/<name>", endpoint="subscriptions.delete", methods=["DELETE"]),
            Rule(f"{sub}:pull", endpoint="subscriptions.pull", methods=["POST"]),
            Rule(f"{sub}:acknowledge", endpoint="subscriptions.acknowledge", methods=["POST"]),
            Rule(f"{sub}:modifyAckDeadline", endpoint="subscriptions.modifyAckDeadline", methods=["POST"]),
            Rule("/v3/projects/<project>/timeSeries", endpoint="timeSeries.list", methods=["GET"]),
        ]
        GoogleRestServer.__init__(self, rules, throttle)
        self.deadline_scale = deadline_scale

    # --- helpers ---------------------------------------------------------------------------------

    def subscription(self, name: str) -> dict[str, Any] | None:
        """The subscription as ``subscriptions.get`` shows it; None when it does not exist."""
        try:
            return self.get_subscription(name)
        except PubSubError:
            return None

    # --- HTTP ------------------------------------------------------------------------------------

    def throttled(self, service: str) -> PubSubError:
        host = f"{service}.googleapis.com"
        metric = f"{host}/requests" if service == "monitoring" else f"{host}/regional_requests"
        message = (
            f"Quota exceeded for quota metric '{metric}' and limit 'requests per minute' of service '{host}'."
        )
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {"service": host, "quota_metric": metric},
        }
        return PubSubError(429, message, [info])

    def handle(self, op: str, request: Request, args: dict[str, Any]) -> Any:
        """Any project is served: a name's project is checked and the name made full."""
        if "project" in args:
            project = args.pop("project")
            if not PROJECT_ID.fullmatch(project):
                raise PubSubError(404, "Requested project not found or user does not have access to it.")
            if "name" in args:
                kind = "subscriptions" if op.startswith("subscriptions.") else "topics"
                args["name"] = f"projects/{project}/{kind}/{args['name']}"
            else:  # a list: that project's
                args["project"] = project
        return super().handle(op, request, args)

    # --- Pub/Sub handlers: one per operation (the route's endpoint name) --------------------------

    def _h_topics_create(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        return self.create_topic(name, body.get("labels") or {})

    def _h_topics_get(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        return self.get_topic(name)

    def _h_topics_delete(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        self.delete_topic(name)
        return {}

    def _h_topics_list(self, req: Request, body: dict[str, Any], project: str) -> dict[str, Any]:
        mine = [t for t in self.list_topics() if t["name"].startswith(f"projects/{project}/")]
        return _page("topics", mine, req)

    def _h_topics_subscriptions_list(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        return _page("subscriptions", self.topic_subscriptions(name), req)

    def _h_topics_publish(self, req: Request, body: dict[str, Any], topic: str) -> dict[str, Any]:
        return {"messageIds": self.publish(topic, body.get("messages") or [])}

    def _h_subscriptions_create(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        return self.create_subscription(name, body)

    def _h_subscriptions_get(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        return self.get_subscription(name)

    def _h_subscriptions_delete(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        self.delete_subscription(name)
        return {}

    def _h_subscriptions_list(self, req: Request, body: dict[str, Any], project: str) -> dict[str, Any]:
        mine = [t for t in self.list_subscriptions() if t["name"].startswith(f"projects/{project}/")]
        return _page("subscriptions", mine, req)

    def _h_subscriptions_pull(self, req: Request, body: dict[str, Any], sub: str) -> dict[str, Any]:
        wait = 0.0 if body.get("returnImmediately") else self.pull_wait_s
        got = self.pull(sub, int_field(body, "maxMessages"), wait)
        return {"receivedMessages": got} if got else {}

    def _h_subscriptions_acknowledge(self, req: Request, body: dict[str, Any], sub: str) -> dict[str, Any]:
        self.acknowledge(sub, list(body.get("ackIds") or []))
        return {}

    def _h_subscriptions_modifyAckDeadline(
        self, req: Request, body: dict[str, Any], sub: str
    ) -> dict[str, Any]:
        self.modify_ack_deadline(sub, list(body.get("ackIds") or []), int_field(body, "ackDeadlineSeconds"))
        return {}

    # --- Monitoring ------------------------------------------------------------------------------

    def _h_timeSeries_list(self, req: Request, body: dict[str, Any], project: str) -> dict[str, Any]:
        if not req.args.get("interval.endTime"):
            raise invalid("Field interval.end_time had an invalid value: a time interval is required.")
        text = req.args.get("filter") or ""
        where = parse_filter(text)
        metric = where.pop("metric.type", "")
        if not metric:
            raise invalid(
                f'Field filter had an invalid value of "{text}": a filter must specify a metric type.'
            )
        if metric not in _METRICS:
            return {}  # a metric with no data here: no time series, as for any metric without data
        now, series = rfc3339(time.time()), []
        for full in self.subscription_names():
            if not full.startswith(f"projects/{project}/"):
                continue  # a project's metrics are its own subscriptions'
            labels = {"project_id": project, "subscription_id": full.rsplit("/", 1)[-1]}
            has = {"resource.type": "pubsub_subscription"} | {
                f"resource.labels.{k}": v for k, v in labels.items()
            }
            stats = self.subscription_stats(full)
            if stats is None or any(has.get(k) != v for k, v in where.items()):
                continue  # (None: deleted since listed)
            point = {
                "interval": {"startTime": now, "endTime": now},
                "value": {"int64Value": str(stats[_METRICS[metric]])},
            }
            series.append(
                {
                    "metric": {"type": metric},
                    "resource": {"type": "pubsub_subscription", "labels": labels},
                    "metricKind": "GAUGE",
                    "valueType": "INT64",
                    "points": [point],
                }
            )
        return {"timeSeries": series} if series else {}


def _page(key: str, items: list[Any], req: Request) -> dict[str, Any]:
    """``pageSize``/``pageToken`` paging (the token is an offset); ``{}`` for no items, as the API."""
    start = int(req.args.get("pageToken") or 0)
    size = int(req.args.get("pageSize") or 0) or 100
    out: dict[str, Any] = {key: items[start : start + size]} if items[start : start + size] else {}
    if start + size < len(items):
        out["nextPageToken"] = str(start + size)
    return out
