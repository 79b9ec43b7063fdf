"""QueueDepthSensor: wait until a work queue drains (or fills) past a threshold."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf

# Importing this module stays cheap (DAG files import it; benchmarks/parse_cost.py): the checks are
# imported by the constructor, the queue readers when the sensor runs.

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.core.retry import TransientBudget

QUEUE_FORMS = (
    "an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>), an SQS queue name, "
    "or a Pub/Sub subscription path (projects/<project>/subscriptions/<name>)"
)
_SUBSCRIPTION = re.compile(r"^projects/[^/\s]+/subscriptions/[^/\s]+$")
_TOPIC = re.compile(r"^projects/[^/\s]+/topics/[^/\s]+$")
_SQS_NAME = re.compile(r"^(?:[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)$")
# the region an AWS queue URL names (as hooks.sqs.region_in_url, without importing the AWS hook)
_URL_REGION = re.compile(
    r"^https?://(?:sqs\.([a-z0-9-]+)\.amazonaws\.com|([a-z0-9-]+)\.queue\.amazonaws\.com)"
)


@dataclass(frozen=True)
class QueueService:
    """What the sensor needs to know of the service a queue argument names: looked up, not branched on."""

    name: str  # the depth reader's and the trigger's provider name: "sqs" / "pubsub"
    conn_attr: str  # the sensor's argument holding its connection
    regional: bool  # read in a region (SQS), or global (Pub/Sub: the path names the project)
    takes_project: bool  # the reader takes project_id (the connection's project override)
    leases_counted: (
        bool  # False: the backlog includes leased messages, count_in_flight=False cannot drop them
    )


SQS = QueueService("sqs", "aws_conn_id", regional=True, takes_project=False, leases_counted=True)
PUBSUB = QueueService("pubsub", "gcp_conn_id", regional=False, takes_project=True, leases_counted=False)
SERVICES = {"sqs-url": SQS, "sqs-name": SQS, "pubsub": PUBSUB}


def queue_kind(queue: Any) -> str:
    """``"sqs-url"``, ``"sqs-name"`` or ``"pubsub"`` for a queue argument; a ValueError naming the
    field and the accepted forms otherwise."""
    from airflow_cloudtrain.operators.checks import check_clean_text

    if not isinstance(queue, str) or not queue.strip():
        what = "is empty" if queue in (None, "") or isinstance(queue, str) else "is not valid"
        raise ValueError(f"queue={queue!r} {what}: give {QUEUE_FORMS}")
    check_clean_text(queue, "queue", QUEUE_FORMS)
    if queue.startswith(("https://", "http://")):
        if queue.rstrip("/").count("/") < 3:
            raise ValueError(f"queue={queue!r} is not a queue URL: give {QUEUE_FORMS}")
        return "sqs-url"
    if _SUBSCRIPTION.match(queue):
        return "pubsub"
    if _TOPIC.match(queue):
        raise ValueError(
            f"queue={queue!r} is a Pub/Sub topic, which has no backlog of its own: "
            "give one of its subscriptions (projects/<project>/subscriptions/<name>)"
        )
    if _SQS_NAME.match(queue):
        return "sqs-name"
    raise ValueError(f"queue={queue!r} is not valid: give {QUEUE_FORMS}")


def _check_depth(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name}={value!r} is not valid: give a whole number of messages, 0 or more")


class QueueDepthSensor(BaseSensorOperator):
    """Wait until a queue's depth is at most ``max_depth`` (0: drained) or at least ``min_depth``.

    ``queue`` is an SQS queue URL (used as is) or name (resolved once with GetQueueUrl), through
    ``aws_conn_id`` / ``region``; or a Pub/Sub subscription path ``projects/<p>/subscriptions/<s>``
    (checked once with ``subscriptions.get``), through ``gcp_conn_id`` (``project_id``: the
    connection's project override; the path's own project is the one read).

    SQS: the depth counts visible, in-flight (received, not yet deleted) and delayed messages; with
    ``count_in_flight=False`` only the visible ones. Pub/Sub: the depth is Cloud Monitoring's
    ``subscription/num_undelivered_messages`` (latest sample, 1-3 minutes behind), every message not
    yet acknowledged, leased ones included, reported as ``visible`` (``in_flight`` 0): there
    ``count_in_flight=False`` cannot leave leased messages out. A subscription Monitoring has no
    sample of yet (new) is waited on, logged, never read as 0.

    A queue that does not exist fails the sensor naming it; it is never taken as empty. Returns
    (XCom) ``{"queue": url or subscription path, "depth", "visible", "in_flight", "delayed"}``.
    Deferrable sensors in one triggerer share one depth call (GetQueueAttributes, Monitoring
    ``timeSeries.list``) per queue per poll.

    ``queue`` takes the name BaseOperator gives the executor queue: the watched queue is kept as
    ``watched_queue`` (templated), ``task.queue`` stays the executor queue, and ``executor_queue=``
    sets it (as ``queue=`` would on other operators).

    :param queue: an SQS queue URL or name, or a Pub/Sub subscription path
        (``projects/<project>/subscriptions/<name>``); kept as ``watched_queue`` (templated).
    :param max_depth: succeed when the depth is at most this many messages (0: the queue drained);
        give this or ``min_depth``.
    :param min_depth: succeed when the depth is at least this many messages; give this or ``max_depth``.
    :param count_in_flight: SQS: count received, not yet deleted messages too (True) or only the
        visible ones; no effect on Pub/Sub, whose backlog includes leased messages.
    :param aws_conn_id: the Airflow connection for SQS (None: boto3's own credential chain).
    :param region: the AWS region of an SQS queue given by name (a queue URL names its own); no effect
        on Pub/Sub.
    :param gcp_conn_id: the Airflow connection for Pub/Sub and Cloud Monitoring.
    :param project_id: the connection's project override (the subscription path names the project read).
    :param poll_interval: seconds (or ``'30s'``, ``'1m'``) between depth reads; ``poke_interval``
        is the same knob.
    :param deferrable: wait in the triggerer (no worker slot), sharing one depth call per queue per
        poll with the other sensors there.
    :param executor_queue: the executor queue the task runs on (what ``queue=`` sets on other
        operators).
    """

    # BaseOperator's own ``queue`` is the executor queue the task runs on; the queue watched here is
    # ``watched_queue`` (``executor_queue=`` sets the other).
    template_fields: Sequence[str] = ("watched_queue",)

    def __init__(
        self,
        *,
        queue: str,
        max_depth: int | None = None,
        min_depth: int | None = None,
        count_in_flight: bool = True,
        aws_conn_id: str | None = "aws_default",
        region: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        project_id: str | None = None,
        poll_interval: float = 30,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        executor_queue: str | None = None,
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.operators.checks import (
            AWS_REGION_RE,
            check_bool,
            check_conn_id,
            check_optional_str,
            check_seconds,
            is_deferred_value,
            parse_project_id,
        )
        from airflow_cloudtrain.spec import warn_user

        poll_interval = check_seconds(poll_interval, "poll_interval")  # '30s', '1m' too
        check_bool(deferrable, "deferrable")
        check_optional_str(region, "region", AWS_REGION_RE.pattern, "an AWS region such as 'us-east-1'")
        check_conn_id(aws_conn_id, "aws_conn_id", "aws_default", optional=True)
        check_conn_id(gcp_conn_id, "gcp_conn_id", "google_cloud_default", optional=False)
        parse_project_id(project_id)
        kwargs.setdefault("poke_interval", poll_interval)  # poke_interval, if given, is the same knob
        if executor_queue is not None:
            check_optional_str(
                executor_queue, "executor_queue", r"\S+", "the name of an executor queue, e.g. 'gpu'"
            )
            kwargs["queue"] = executor_queue
        super().__init__(**kwargs)
        if not is_deferred_value(queue):
            kind = queue_kind(queue)  # a template or an XComArg is checked once rendered (execute)
            if not SERVICES[kind].regional and region:
                warn_user(
                    f"region={region!r} has no effect on a Pub/Sub subscription: the path names its project "
                    "and Pub/Sub is global"
                )
            url_region = (
                (m.group(1) or m.group(2)) if kind == "sqs-url" and (m := _URL_REGION.match(queue)) else None
            )
            if region and url_region and region != url_region:
                raise ValueError(
                    f"region={region!r} is not the region of queue={queue!r} ({url_region!r}): use "
                    f"region={url_region!r}, or leave region out (the URL says where the queue is)"
                )
        if max_depth is None and min_depth is None:
            raise ValueError(
                "give max_depth=N (succeed when the depth is <= N; 0: the queue drained) "
                "or min_depth=N (succeed when the depth is >= N)"
            )
        if max_depth is not None and min_depth is not None:
            raise ValueError(
                f"max_depth={max_depth!r} and min_depth={min_depth!r} were both given: give exactly one"
            )
        _check_depth("max_depth", max_depth)
        _check_depth("min_depth", min_depth)
        if not isinstance(count_in_flight, bool):
            raise ValueError(f"count_in_flight={count_in_flight!r} is not valid: give True or False")
        if not self.poke_interval:
            raise ValueError("poke_interval=0 is not valid: give seconds between polls, more than 0")
        self.watched_queue = queue
        self.max_depth = max_depth
        self.min_depth = min_depth
        self.count_in_flight = count_in_flight
        self.aws_conn_id = aws_conn_id
        self.region = region
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    # --- where the queue is (resolved once per try) -----------------------------------------------

    def _service(self) -> QueueService:
        return SERVICES[queue_kind(self.watched_queue)]

    def _target(self) -> tuple[str, str | None]:
        """(the id depths are read by: an SQS queue URL or a Pub/Sub subscription path, the region
        to read it in: None for Pub/Sub)."""
        if getattr(self, "_resolved", None) is None:
            kind = queue_kind(self.watched_queue)  # rendered now: check it again
            if not SERVICES[kind].regional:
                region = None
            else:
                from airflow_cloudtrain.hooks.sqs import region_in_url

                region = self.region or (region_in_url(self.watched_queue) if kind == "sqs-url" else None)
            self._resolved = (self._reader(region).resolve(self.watched_queue), region)
        return self._resolved

    def _reader(self, region: str | None) -> Any:
        readers: dict[tuple[str, str | None], Any] | None = getattr(self, "_readers", None)
        if readers is None:
            readers = {}
            self._readers = readers
        service = self._service()
        if (service.name, region) not in readers:
            from airflow_cloudtrain.triggers.queue_depth import depth_reader

            project = self.project_id if service.takes_project else None
            readers[(service.name, region)] = depth_reader(
                service.name, getattr(self, service.conn_attr), region, project
            )
        return readers[(service.name, region)]

    def _describe_threshold(self) -> str:
        return f"<= {self.max_depth}" if self.max_depth is not None else f">= {self.min_depth}"

    # --- waiting ---------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        self._resolved = None  # type: ignore[assignment]
        self._budget: TransientBudget | None = None  # set by the first poke
        if not self._service().leases_counted and not self.count_in_flight:
            self.log.warning(
                "count_in_flight=False has no effect on Pub/Sub: the backlog (num_undelivered_messages) "
                "includes messages pulled and not yet acknowledged"
            )
        if not self.deferrable:
            return super().execute(context)
        done = self.poke(context)
        if done:
            return done.xcom_value
        from airflow_cloudtrain.triggers.queue_depth import QueueDepthTrigger

        url, region = self._target()
        service = self._service()
        self.defer(
            trigger=QueueDepthTrigger(
                queue=url,
                max_depth=self.max_depth,
                min_depth=self.min_depth,
                count_in_flight=self.count_in_flight,
                provider=service.name,
                conn_id=getattr(self, service.conn_attr),
                region=region,
                project_id=self.project_id if service.takes_project else None,
                poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> PokeReturnValue:
        from airflow.exceptions import AirflowException

        from airflow_cloudtrain.core.retry import TransientBudget
        from airflow_cloudtrain.triggers.queue_depth import DepthNotKnownYet, QueueNotFound, evaluate_depth

        budget = getattr(self, "_budget", None) or TransientBudget()
        self._budget = budget
        try:
            url, region = self._target()
            depth = self._reader(region).read(url)
            if depth.error is not None and not isinstance(depth.error, DepthNotKnownYet):
                raise depth.error
        except QueueNotFound:
            raise
        except Exception as err:
            budget.failed(err)  # re-raises unless transient (throttling, 5xx) within the budget
            self.log.warning(
                "Reading the depth of %s failed (%s); trying again next poll", self.watched_queue, err
            )
            return PokeReturnValue(is_done=False)
        budget.ok()  # an answer, even "no data yet", is a good poll
        if depth.error is not None:  # not known yet: neither 0 nor a failure
            self.log.info("Queue %s: %s; waiting for %s", url, depth.error, self._describe_threshold())
            return PokeReturnValue(is_done=False)
        event = evaluate_depth(depth, self.max_depth, self.min_depth, self.count_in_flight)
        if event is None:
            self.log.info(
                "Queue %s: depth %d, waiting for %s",
                url,
                depth.depth(self.count_in_flight),
                self._describe_threshold(),
            )
            return PokeReturnValue(is_done=False)
        if event["status"] != "success":
            raise AirflowException(event["message"])
        result = depth.result(self.count_in_flight)
        self.log.info("Queue %s: depth %d (%s): done", url, result["depth"], self._describe_threshold())
        return PokeReturnValue(is_done=True, xcom_value=result)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            from airflow.exceptions import AirflowException

            raise AirflowException(
                event.get("message", f"queue {self.watched_queue} did not reach its depth")
            )
        result: dict[str, Any] = {
            k: event[k] for k in ("queue", "depth", "visible", "in_flight", "delayed") if k in event
        }
        self.log.info(
            "Queue %s: depth %d (%s): done",
            result.get("queue"),
            result.get("depth", -1),
            self._describe_threshold(),
        )
        return result
