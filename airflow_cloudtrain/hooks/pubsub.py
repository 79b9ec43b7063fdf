"""Pub/Sub subscription depth through the Airflow Google connection: Cloud Monitoring's
``subscription/num_undelivered_messages`` (the backlog), ``subscriptions.get`` to tell a subscription
that does not exist from one without data yet.

The backlog counts every message not yet acknowledged, leased (pulled, being worked on) or not, so it
is ``visible`` here and ``in_flight`` is 0: Pub/Sub has no per-subscription metric for pulled-but-
unacked messages (``num_outstanding_messages`` is for push subscriptions), so ``count_in_flight=False``
cannot leave leased messages out. Monitoring samples the metric every minute and shows a sample 1-3
minutes later: the depth read is up to a few minutes old, and a new subscription has no data at all
for its first minutes. No time series is never read as 0: the subscription missing is
``QueueDepth(missing=True)``; existing without data is ``QueueDepth(error=DepthNotKnownYet(...))``,
which the sensor and the trigger wait out (logged), neither failing nor succeeding on it.

Monitoring is read over its REST API with an authorized ``requests`` session (the hook's
credentials, the connection extra ``monitoring_endpoint``): google-cloud-monitoring 2.32 ships no
REST transport for ``MetricServiceClient``, and gRPC is a second network stack for one GET. Both
clients are synchronous and thread-safe enough for concurrent GETs; the trigger runs them in worker
threads (``asyncio.to_thread``), never on the event loop. Google libraries are imported when first
used, so DAG parsing stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Hashable
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

from airflow_cloudtrain.hooks.depth import DepthNotKnownYet, DepthReader, QueueDepth, QueueNotFound
from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

BACKLOG_METRIC = "pubsub.googleapis.com/subscription/num_undelivered_messages"
MONITORING_URL = "https://monitoring.googleapis.com"
WINDOW_S = 300  # how far back a read looks for the latest sample (samples come every 60 s, 1-3 min late)
TIMEOUT_S = 30.0  # per HTTP call: a hung call must not hold a worker thread (or a poke) for long
MAX_CONCURRENT = 8  # reads in flight at once (worker threads) for one poll of many subscriptions
MAX_PAGES = 10  # timeSeries.list pages per read (one subscription: one series, one page)

_PATH = re.compile(r"^projects/([^/\s]+)/subscriptions/([^/\s]+)$")
_FRACTION = re.compile(r"(\.\d{6})\d+")  # RFC 3339 nanoseconds -> microseconds for fromisoformat


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(_FRACTION.sub(r"\1", text).replace("Z", "+00:00"))


def latest_value(series: list[dict[str, Any]]) -> int | None:
    """The newest point's value over every series (one, for one subscription); None: no point."""
    best: tuple[datetime, int] | None = None
    for one in series:
        for point in one.get("points") or []:
            value = point.get("value") or {}
            if "int64Value" in value:
                number = int(value["int64Value"])
            elif "doubleValue" in value:
                number = round(float(value["doubleValue"]))
            else:
                continue
            interval = point.get("interval") or {}
            stamp = interval.get("endTime") or interval.get("startTime")
            when = _instant(stamp) if stamp else datetime.min.replace(tzinfo=timezone.utc)
            if best is None or when > best[0]:
                best = (when, number)
    return None if best is None else best[1]


class PubSubDepthReader(DepthReader):
    """Subscription backlogs for one Google connection (and project, for bare subscription names).

    Subscriptions are read by path, ``projects/<project>/subscriptions/<name>``; the path's project is
    the one read (its Monitoring and its Pub/Sub), whatever ``project_id`` says. ``region`` is unused
    (Pub/Sub and its metrics are global) and kept only in ``key``, the poll group's name.

    :param conn_id: the Airflow Google connection (None: ``google_cloud_default``).
    :param project_id: the project bare subscription names are in (None: the connection's).
    :param region: unused (Pub/Sub is global); part of the poll group's key only.
    """

    provider: ClassVar[str] = "pubsub"

    def __init__(
        self,
        conn_id: str | None = "google_cloud_default",
        project_id: str | None = None,
        region: str | None = None,
    ) -> None:
        from airflow_cloudtrain.hooks.follow import Following

        self.key: Hashable = ("pubsub", conn_id, project_id, region)
        self.conn_id = conn_id or "google_cloud_default"
        self.project_id = project_id
        # the hook and its clients, made anew when the connection changed (``hooks.follow``): a
        # reader lives as long as its poll group, which a steady stream of sensors keeps alive
        self._clients: Following[_Clients] = Following(
            self.conn_id, lambda: _Clients(self.conn_id, self.project_id), lambda clients: clients.close()
        )

    # --- hook and clients: built on first use (in the triggerer: in a worker thread, as fetching
    # the connection is blocking) -------------------------------------------------------------------

    @property
    def hook(self) -> CloudTrainGcpHook:
        return self._clients.get().hook

    def subscriber(self) -> Any:
        return self._clients.get().subscriber()

    def session(self) -> Any:
        return self._clients.get().session()

    def monitoring_url(self) -> str:
        return str(self.hook._get_field("monitoring_endpoint") or MONITORING_URL).rstrip("/")

    def close(self) -> None:
        self._clients.close()

    # --- the DepthReader interface ---------------------------------------------------------------

    def path(self, queue: str) -> str:
        """The subscription path for a path (as is) or a bare name (in the hook's project)."""
        if _PATH.match(queue):
            return queue
        if "/" in queue or not queue.strip():
            raise ValueError(
                f"queue={queue!r} is not a Pub/Sub subscription: give projects/<project>/subscriptions/<name>"
            )
        return f"projects/{self.hook.project}/subscriptions/{queue}"

    def exists(self, path: str) -> bool:
        """``subscriptions.get``: True, False (NotFound), or the call's error raised."""
        from google.api_core.exceptions import NotFound

        try:
            self.subscriber().get_subscription(subscription=path, retry=None, timeout=TIMEOUT_S)
        except NotFound:
            return False
        return True

    def resolve(self, queue: str) -> str:
        """The subscription path, once ``subscriptions.get`` found it; ``QueueNotFound`` naming it if not."""
        path = self.path(queue)
        if not self.exists(path):
            raise QueueNotFound(
                f"Pub/Sub subscription {path} does not exist (a missing subscription is never taken as empty)"
            )
        return path

    def backlog_series(self, path: str) -> list[dict[str, Any]]:
        """Monitoring ``projects.timeSeries.list`` of the subscription's backlog over the last
        ``WINDOW_S`` seconds (every page; HTTP errors as google-api-core exceptions)."""
        from google.api_core.exceptions import from_http_response

        match = _PATH.match(path)
        if match is None:
            raise ValueError(f"{path!r} is not a subscription path (projects/<project>/subscriptions/<name>)")
        project, name = match.groups()
        now = datetime.now(timezone.utc)
        params: dict[str, Any] = {
            "filter": (
                f'metric.type = "{BACKLOG_METRIC}" AND resource.type = "pubsub_subscription" '
                f'AND resource.labels.project_id = "{project}" '
                f'AND resource.labels.subscription_id = "{name}"'
            ),
            "interval.startTime": _rfc3339(now - timedelta(seconds=WINDOW_S)),
            "interval.endTime": _rfc3339(now),
        }
        url = f"{self.monitoring_url()}/v3/projects/{project}/timeSeries"
        series: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            response = self.session().get(url, params=params, timeout=TIMEOUT_S)
            if response.status_code >= 400:
                raise from_http_response(response)
            page = response.json()
            series.extend(page.get("timeSeries") or [])
            token = page.get("nextPageToken") or ""
            if not token or token == params.get("pageToken"):
                break
            params["pageToken"] = token
        return series

    def read(self, queue: str) -> QueueDepth:
        """The backlog from the newest sample. No sample: missing (no such subscription) or
        ``error=DepthNotKnownYet`` (it exists, Monitoring has no data for it yet); never 0."""
        path = self.path(queue)
        value = latest_value(self.backlog_series(path))
        if value is not None:
            return QueueDepth(queue=queue, visible=value)
        if not self.exists(path):
            return QueueDepth(queue=queue, missing=True)
        return QueueDepth(
            queue=queue,
            error=DepthNotKnownYet(
                f"no num_undelivered_messages data yet for Pub/Sub subscription {path} in Cloud "
                f"Monitoring over the last {WINDOW_S // 60} minutes (a new subscription's first sample "
                "shows 1-3 minutes after it is created); not taken as 0"
            ),
        )

    async def read_async(self, queues: list[str]) -> dict[str, QueueDepth]:
        """``read`` in worker threads, one per distinct subscription, a few at once; a failure is
        that subscription's ``error`` (and makes the next read re-read the connection first)."""
        gate = asyncio.Semaphore(MAX_CONCURRENT)

        async def one(queue: str) -> QueueDepth:
            try:
                async with gate:
                    return await asyncio.to_thread(self.read, queue)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._clients.failed()
                return QueueDepth(queue, error=err)

        depths = await asyncio.gather(*(one(q) for q in dict.fromkeys(queues)))
        return {d.queue: d for d in depths}

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


class _Clients:
    """The hook of one reading of the connection, and its clients, each built on first use, once,
    by whichever thread gets there first."""

    def __init__(self, conn_id: str, project_id: str | None) -> None:
        self.hook = CloudTrainGcpHook(gcp_conn_id=conn_id, project_id=project_id)
        self._lock = threading.RLock()
        self._subscriber: Any = None
        self._session: Any = None

    def subscriber(self) -> Any:
        with self._lock:
            if self._subscriber is None:
                self._subscriber = self.hook.subscriber_client()
            return self._subscriber

    def session(self) -> Any:
        with self._lock:
            if self._session is None:
                from google.auth.transport.requests import AuthorizedSession

                self._session = AuthorizedSession(self.hook._creds())
            return self._session

    def close(self) -> None:
        with self._lock:
            subscriber, self._subscriber = self._subscriber, None
            session, self._session = self._session, None
        for closing in (getattr(subscriber, "transport", None), session):
            if closing is not None:
                with contextlib.suppress(Exception):  # a client that will not close cleanly is gone anyway
                    closing.close()
