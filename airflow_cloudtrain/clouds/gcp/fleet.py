"""A fleet on GCP: a Pub/Sub topic and pull subscription, an instance template and a managed instance group.

``GcpFleet`` is the GCP ``core.fleet.FleetBackend``, the twin of ``clouds.aws.fleet.AwsFleet`` (neither
is the base of the other; ``clouds.registry.fleet_backend_for`` picks). Each ``make_*`` goes through
``ResourceLedger.ensure``. Every name comes from the run key's digest (topic and subscription ``ct-<digest>-items``,
dead-letter topic and subscription ``ct-<digest>-dlq``, template and group ``ct-<digest>``), so a retried
task finds what an earlier try made instead of making a second one, and the ledger kinds registered at
the bottom find and delete them with nothing but the digest.

What differs from AWS, and why:

- **No backlog API.** Pub/Sub cannot say how many messages wait (Cloud Monitoring's
  ``num_undelivered_messages`` lags by minutes), so ``depth`` returns None and the watch counts the items
  without an outcome instead; the run ends when every item has its outcome.
- **Dead letters are collected.** A message delivered ``max_delivery_attempts`` times without an ack
  (workers that vanished) goes to the dead-letter topic, whose subscription the watch pulls each poll:
  an item found there without an outcome gets a failed one, written by the operator. Pub/Sub allows
  5-100 delivery attempts; a job that fails is given up by the worker itself after
  ``max_item_attempts`` (the worker counts deliveries), so fewer attempts still hold for failed jobs.
- **A constant group.** The group is made with ``num_workers`` and keeps that size (it recreates
  preempted VMs); workers leave through ``deleteInstances``, which also lowers the target size. The watch
  only raises the size back when items wait and the group shrank below them.
- **Creation stamp.** Subscriptions have no creation time, so a label ``cloudtrain-created`` (epoch
  seconds) stands in for SQS's ``CreatedTimestamp``: the enqueue marker is tied to it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.clouds.gcp.gce import gcp_cloud, instance_properties, label_value, map_api_error
from airflow_cloudtrain.contract.runs import TAG_RUN_KEY
from airflow_cloudtrain.core.fleet import Depth, FleetMaking, FleetQueues, GroupPlan, GroupState, WorkerPlace
from airflow_cloudtrain.core.inventory import Tagged, digest_in_name, register_lister, timestamp
from airflow_cloudtrain.core.ledger import RELEASE_FIRST, Resource, ResourceKind, register_kind

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend
    from airflow_cloudtrain.core.cloud import Instance, LaunchRequest

log = logging.getLogger(__name__)

PUBLISH_BATCH = 100  # messages per publish call (Pub/Sub takes up to 1,000 and 10 MB)
MIN_ACK_S, MAX_ACK_S = 10, 600  # Pub/Sub's ack deadline bounds
MIN_DELIVERIES, MAX_DELIVERIES = 5, 100  # Pub/Sub's dead-letter policy bounds
CREATED_LABEL = "cloudtrain-created"
WORKER_SCOPES = [  # the storage and logging scopes of a single run, plus the worker's queue and group
    "https://www.googleapis.com/auth/pubsub",
    "https://www.googleapis.com/auth/compute",
]
__all__ = ["Depth", "GcpFleet", "GroupState", "fleet_of"]


def group_name(digest: str) -> str:
    return f"ct-{digest}"


def queue_name(digest: str, dead_letter: bool = False) -> str:
    return f"ct-{digest}-{'dlq' if dead_letter else 'items'}"


def _not_found(err: Exception) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(err, gexc.NotFound)


class GcpFleet:
    """Pub/Sub in one project, templates (global) and one zonal managed instance group."""

    provider = "gcp"
    sweep_kinds: tuple[str, ...] = (
        "pubsub_topic",
        "pubsub_subscription",
        "instance_template",
        "mig",
        "instance",
    )

    def __init__(
        self,
        hook: Any,
        project: str,
        region: str,
        zone: str | None,
        zones: list[str],
        backend: GcpRunBackend | None = None,
    ) -> None:
        self.hook = hook
        self.project = project
        self.region = region
        self.zone = zone
        self.zones = zones
        self.backend = backend
        self._clients: dict[str, Any] = {}
        self._cloud: Any = None  # GcpCloud of the group's zone, for the members

    def group_name(self, digest: str) -> str:
        return group_name(digest)

    # --- making, through the ledger --------------------------------------------------------------

    def make_queues(self, making: FleetMaking, lease_s: int, max_attempts: int) -> FleetQueues:
        """The dead-letter topic and its subscription (the watch pulls it), then the items' topic and
        its pull subscription (ack deadline = the lease, the dead-letter policy)."""
        dead_name = queue_name(making.digest, dead_letter=True)
        dead_topic = self._make_topic(making, dead_name)
        self._make_subscription(making, dead_name, dead_topic, None, lease_s, max_attempts)
        name = queue_name(making.digest)
        topic = self._make_topic(making, name)
        queue = self._make_subscription(making, name, topic, dead_topic, lease_s, max_attempts)
        return FleetQueues(
            queue=queue,
            dead_letter=dead_topic,
            send_to=topic,
            dead_letter_source=self.subscription_path(dead_name),
            topic=topic,
        )

    def _make_topic(self, making: FleetMaking, name: str) -> str:
        path, made = making.ensure(
            "pubsub_topic", None, name, lambda: self.topic(name), lambda: self.create_topic(name, making.tags)
        )
        if made:
            making.log.info("Created topic %s", path)
        return path

    def _make_subscription(
        self,
        making: FleetMaking,
        name: str,
        topic: str,
        dead_topic: str | None,
        lease_s: int,
        max_attempts: int,
    ) -> str:
        path, made = making.ensure(
            "pubsub_subscription",
            None,
            name,
            lambda: self.subscription(name),
            lambda: self.create_subscription(name, topic, making.tags, lease_s, dead_topic, max_attempts),
        )
        if made:
            making.log.info("Created subscription %s", path)
        return path

    def place(self, zone: str | None, offer: Offer) -> None:
        """The group's zone: ``zone=``, else the first zone of the cheapest offer."""
        if self.zone is None:
            self.zone = zone or (offer.zones[0] if offer.zones else f"{self.region}-a")

    def worker_settings(self, queues: FleetQueues, offer: Offer) -> WorkerPlace:
        self.place(None, offer)
        return {"topic": queues.topic, "zone": self.zone, "project": self.project}

    def make_template(self, making: FleetMaking, name: str, request: LaunchRequest) -> str:
        link, made = making.ensure(
            "instance_template",
            None,
            name,
            lambda: self.template(name),
            lambda: self.create_template(name, request),
            record=name,
        )
        if made:
            making.log.info("Created instance template %s", name)
        return link

    def make_group(self, making: FleetMaking, plan: GroupPlan) -> None:
        """A group of ``num_workers`` (fewer when fewer items wait): the constant size the studio
        tool's ``--num-workers`` asks for. ``bid`` has no effect on GCE (Spot VMs have no bid)."""
        name, zone = plan.name, self.zone

        def find() -> str | None:
            return name if self.group(name) is not None else None

        def create() -> str:
            self.create_group(name, plan.template, plan.desired)
            return name

        _, made = making.ensure("mig", zone, name, find, create)
        if made:
            making.log.info(
                "Created managed instance group %s in %s: %d %s worker(s) of %s",
                name,
                zone,
                plan.desired,
                "Spot" if plan.spot else "standard",
                plan.instance_types[0],
            )
        else:
            making.log.info("Re-attached to group %s", name)

    def _client(self, name: str) -> Any:
        if name not in self._clients:
            self._clients[name] = getattr(self.hook, f"{name}_client")()
        return self._clients[name]

    @property
    def publisher(self) -> Any:
        return self._client("publisher")

    @property
    def subscriber(self) -> Any:
        return self._client("subscriber")

    def topic_path(self, name: str) -> str:
        return f"projects/{self.project}/topics/{name}"

    def subscription_path(self, name: str) -> str:
        return f"projects/{self.project}/subscriptions/{name}"

    # --- the queue: a topic and its pull subscription -------------------------------------------

    def topic(self, name: str) -> str | None:
        try:
            return str(self.publisher.get_topic(topic=self.topic_path(name)).name)
        except Exception as err:
            if _not_found(err):
                return None
            raise

    def create_topic(self, name: str, labels: dict[str, str]) -> str:
        from google.api_core import exceptions as gexc

        path = self.topic_path(name)
        with contextlib.suppress(gexc.Conflict):  # 409 over REST: a retried call after a lost answer
            self.publisher.create_topic(request={"name": path, "labels": _labels(labels)})
        return path

    def subscription(self, name: str) -> str | None:
        try:
            return str(self.subscriber.get_subscription(subscription=self.subscription_path(name)).name)
        except Exception as err:
            if _not_found(err):
                return None
            raise

    def create_subscription(
        self,
        name: str,
        topic: str,
        labels: dict[str, str],
        lease_s: int,
        dead_letter_topic: str | None,
        max_deliveries: int,
    ) -> str:
        """A pull subscription: ack deadline = the lease, a dead-letter policy when a topic is given,
        the creation stamp as a label, messages kept 7 days (the most)."""
        from google.api_core import exceptions as gexc

        path = self.subscription_path(name)
        request: dict[str, Any] = {
            "name": path,
            "topic": topic,
            "ack_deadline_seconds": max(MIN_ACK_S, min(MAX_ACK_S, int(lease_s))),
            "labels": {**_labels(labels), CREATED_LABEL: str(int(time.time() * 1000))},
            "message_retention_duration": {"seconds": 7 * 86400},
        }
        if dead_letter_topic:
            request["dead_letter_policy"] = {
                "dead_letter_topic": dead_letter_topic,
                "max_delivery_attempts": max(MIN_DELIVERIES, min(MAX_DELIVERIES, max_deliveries)),
            }
        with contextlib.suppress(gexc.Conflict):
            self.subscriber.create_subscription(request=request)
        return path

    def queue_created(self, subscription: str) -> str:
        got = self.subscriber.get_subscription(subscription=subscription)
        return str(dict(got.labels).get(CREATED_LABEL, ""))

    def depth(self, subscription: str) -> Depth | None:
        """Pub/Sub has no backlog call: the watch counts items without an outcome instead."""
        return None

    def send(self, topic: str, bodies: list[tuple[str, str]]) -> None:
        """(id, body) pairs published in batches; the item id rides along as an attribute."""
        for start in range(0, len(bodies), PUBLISH_BATCH):
            batch = bodies[start : start + PUBLISH_BATCH]
            messages = [{"data": body.encode(), "attributes": {"item": item}} for item, body in batch]
            self.publisher.publish(topic=topic, messages=messages)

    def drain(self, subscription: str) -> None:
        """Ack whatever a dead try published (no worker exists yet, so nothing else pulls)."""
        while True:
            got = self.subscriber.pull(request={"subscription": subscription, "max_messages": 1000})
            ack_ids = [m.ack_id for m in got.received_messages]
            if not ack_ids:
                return
            self.subscriber.acknowledge(subscription=subscription, ack_ids=ack_ids)

    def take_dead_letters(self, subscription: str) -> list[tuple[str, int]]:
        """(message body, deliveries) of what reached the dead-letter subscription; acked once read."""
        got = self.subscriber.pull(request={"subscription": subscription, "max_messages": 1000})
        out = [(m.message.data.decode(), int(m.delivery_attempt or 0)) for m in got.received_messages]
        if got.received_messages:
            self.subscriber.acknowledge(
                subscription=subscription, ack_ids=[m.ack_id for m in got.received_messages]
            )
        return out

    def delete_subscription(self, path: str) -> None:
        try:
            self.subscriber.delete_subscription(subscription=path)
        except Exception as err:
            if not _not_found(err):
                raise

    def delete_topic(self, path: str) -> None:
        try:
            self.publisher.delete_topic(topic=path)
        except Exception as err:
            if not _not_found(err):
                raise

    # --- the instance template ------------------------------------------------------------------

    def template(self, name: str) -> str | None:
        try:
            return str(self._client("templates").get(project=self.project, instance_template=name).self_link)
        except Exception as err:
            if _not_found(err):
                return None
            raise

    def create_template(self, name: str, request: LaunchRequest) -> str:
        """A single run's launch shape with the worker's scopes; Spot or preemptible scheduling, and
        ``maxRunDuration`` as the hard stop, come from the request as for one VM."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        properties = instance_properties(request, None)
        for account in properties["service_accounts"]:
            account["scopes"] = list(dict.fromkeys([*account["scopes"], *WORKER_SCOPES]))
        body = compute_v1.InstanceTemplate(
            name=name,
            description="cloudtrain fleet workers",
            properties=compute_v1.InstanceProperties(properties),
        )
        templates = self._client("templates")
        try:
            op = templates.insert(project=self.project, instance_template_resource=body)
        except gexc.Conflict:
            pass
        except gexc.GoogleAPICallError as err:
            raise map_api_error(err) from err
        else:
            _raise_op_error(op)
        return f"projects/{self.project}/global/instanceTemplates/{name}"

    def delete_template(self, name: str) -> None:
        try:
            self._client("templates").delete(project=self.project, instance_template=name)
        except Exception as err:
            if not _not_found(err):
                raise

    # --- the managed instance group -------------------------------------------------------------

    def group(self, name: str) -> GroupState | None:
        zone = self.zone or self._group_zone(name)
        if zone is None:
            return None
        groups = self._client("groups")
        try:
            raw = groups.get(project=self.project, zone=zone, instance_group_manager=name)
        except Exception as err:
            if _not_found(err):
                return None
            raise
        members = {
            m.instance.rsplit("/", 1)[-1]: False
            for m in groups.list_managed_instances(
                project=self.project, zone=zone, instance_group_manager=name
            )
        }
        return GroupState(name, int(raw.target_size), int(raw.target_size), members)

    def _group_zone(self, name: str) -> str | None:
        for zone in self.zones:
            try:
                self._client("groups").get(project=self.project, zone=zone, instance_group_manager=name)
            except Exception as err:
                if _not_found(err):
                    continue
                raise
            self.zone = zone
            return zone
        return None

    def create_group(self, name: str, template: str, size: int) -> None:
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        body = compute_v1.InstanceGroupManager(
            name=name,
            base_instance_name=name,
            instance_template=template,
            target_size=size,
            description="cloudtrain fleet workers",
        )
        try:
            op = self._client("groups").insert(
                project=self.project, zone=self.zone, instance_group_manager_resource=body
            )
        except gexc.Conflict:
            return
        except gexc.GoogleAPICallError as err:
            raise map_api_error(err) from err
        _raise_op_error(op)

    def set_desired(self, name: str, desired: int) -> None:
        self._client("groups").resize(
            project=self.project, zone=self.zone, instance_group_manager=name, size=desired
        )

    def replace_member(self, name: str, instance_id: str) -> None:
        """``recreateInstances``: the group deletes the VM and makes it again under the same name."""
        from google.cloud import compute_v1

        url = f"projects/{self.project}/zones/{self.zone}/instances/{instance_id}"
        body = compute_v1.InstanceGroupManagersRecreateInstancesRequest(instances=[url])
        self._client("groups").recreate_instances(
            project=self.project,
            zone=self.zone,
            instance_group_manager=name,
            instance_group_managers_recreate_instances_request_resource=body,
        )

    def members(self, digest: str) -> list[Instance]:
        """Every VM of the run, any state (by the run-key label the template gives them), in the
        group's zone: ``GcpCloud.find``, the sweep's own search."""
        if self._cloud is None:
            self._cloud = gcp_cloud(self.hook, self.region, self.zone)
        return self._cloud.find(digest, ended=True)

    def delete_group(self, name: str) -> None:
        """Delete the group and wait for it: Compute Engine deletes every member with it, and the
        template can only go once no group uses it."""
        zone = self.zone or self._group_zone(name)
        if zone is None:
            return
        try:
            op = self._client("groups").delete(project=self.project, zone=zone, instance_group_manager=name)
        except Exception as err:
            if not _not_found(err):
                raise
            return
        operations = self.hook.operations_client()
        deadline = time.monotonic() + 300
        while str(getattr(op.status, "name", op.status)) != "DONE" and time.monotonic() < deadline:
            op = operations.wait(project=self.project, zone=zone, operation=op.name)


def _raise_op_error(op: Any) -> None:
    """An operation that ended with an error (the emulator and most inserts answer DONE at once)."""
    code = getattr(op, "error_code", None)
    if code:
        from airflow_cloudtrain.clouds.gcp.gce import map_code

        raise map_code(str(code), str(getattr(op, "error_message", "") or code))


def _labels(tags: dict[str, str]) -> dict[str, str]:
    return {label_value(k): label_value(v) for k, v in tags.items() if v is not None}


def fleet_of(backend: GcpRunBackend, zone: str | None = None) -> GcpFleet:
    """The ``GcpFleet`` of a ``GcpRunBackend`` (its connection, project and region)."""
    from airflow_cloudtrain.clouds.gcp.gce import zones_of

    region = backend.region or (zone or "").rsplit("-", 1)[0]
    return GcpFleet(backend.hook, backend.hook.project, region, zone, zones_of(region), backend)


# --- ledger kinds: found by name from the run key, deleted with "not found" as done ---------------


def _find_subscriptions(backend: GcpRunBackend, digest: str) -> list[Resource]:
    fleet = fleet_of(backend)
    return [
        Resource("pubsub_subscription", path, None)
        for dead_letter in (False, True)
        if (path := fleet.subscription(queue_name(digest, dead_letter)))
    ]


def _delete_subscriptions(backend: GcpRunBackend, resources: list[Resource]) -> None:
    fleet = fleet_of(backend)
    for resource in resources:
        fleet.delete_subscription(resource.id or "")


def _find_topics(backend: GcpRunBackend, digest: str) -> list[Resource]:
    fleet = fleet_of(backend)
    return [
        Resource("pubsub_topic", path, None)
        for dead_letter in (False, True)
        if (path := fleet.topic(queue_name(digest, dead_letter)))
    ]


def _delete_topics(backend: GcpRunBackend, resources: list[Resource]) -> None:
    fleet = fleet_of(backend)
    for resource in resources:
        fleet.delete_topic(resource.id or "")


def _find_templates(backend: GcpRunBackend, digest: str) -> list[Resource]:
    fleet = fleet_of(backend)
    name = group_name(digest)
    return [Resource("instance_template", name, None)] if fleet.template(name) else []


def _delete_templates(backend: GcpRunBackend, resources: list[Resource]) -> None:
    fleet = fleet_of(backend)
    for resource in resources:
        fleet.delete_template(resource.id or "")


def _find_groups(backend: GcpRunBackend, digest: str) -> list[Resource]:
    fleet = fleet_of(backend)
    name = group_name(digest)
    zone = fleet._group_zone(name)
    return [Resource("mig", name, zone)] if zone else []


def _delete_groups(backend: GcpRunBackend, resources: list[Resource]) -> None:
    for resource in resources:
        fleet_of(backend, resource.location).delete_group(resource.id or "")


PUBSUB_TOPIC = register_kind(ResourceKind("pubsub_topic", _find_topics, _delete_topics))
PUBSUB_SUBSCRIPTION = register_kind(
    ResourceKind("pubsub_subscription", _find_subscriptions, _delete_subscriptions)
)
INSTANCE_TEMPLATE = register_kind(ResourceKind("instance_template", _find_templates, _delete_templates))
MIG = register_kind(ResourceKind("mig", _find_groups, _delete_groups, release_order=RELEASE_FIRST))


# --- cloudtrain gc: every topic, subscription, template and group of ours, whatever its run ---------


def _run_label(labels: Any) -> str | None:
    return dict(labels or {}).get(label_value(TAG_RUN_KEY)) or None


def _list_topics(backend: GcpRunBackend) -> list[Tagged]:
    """Topics labelled with a run key (Pub/Sub keeps no creation time for a topic)."""
    fleet = fleet_of(backend)
    topics = fleet.publisher.list_topics(request={"project": f"projects/{fleet.project}"})
    return [
        Tagged("pubsub_topic", str(t.name), None, digest)
        for t in topics
        if (digest := _run_label(t.labels) or digest_in_name(str(t.name)))
    ]


def _list_subscriptions(backend: GcpRunBackend) -> list[Tagged]:
    """Subscriptions labelled with a run key; their age is our creation label (milliseconds)."""
    fleet = fleet_of(backend)
    subs = fleet.subscriber.list_subscriptions(request={"project": f"projects/{fleet.project}"})
    return [
        Tagged(
            "pubsub_subscription",
            str(s.name),
            None,
            digest,
            created_at=timestamp(dict(s.labels).get(CREATED_LABEL)),
            state=f"topic {str(s.topic).rsplit('/', 1)[-1]}",
        )
        for s in subs
        if (digest := _run_label(s.labels) or digest_in_name(str(s.name)))
    ]


def _template_uri(raw: Any) -> str | None:
    from airflow_cloudtrain.contract.runs import TAG_RUN_URI

    items = getattr(getattr(raw.properties, "metadata", None), "items", None) or []
    return next((str(i.value) for i in items if i.key == TAG_RUN_URI and i.value), None)


def _list_templates(backend: GcpRunBackend) -> list[Tagged]:
    fleet = fleet_of(backend)
    return [
        Tagged(
            "instance_template",
            str(t.name),
            None,
            digest,
            _template_uri(t),
            timestamp(t.creation_timestamp),
            "global",
        )
        for t in fleet._client("templates").list(project=fleet.project)
        if (digest := _run_label(t.properties.labels) or digest_in_name(str(t.name)))
    ]


def _list_groups(backend: GcpRunBackend) -> list[Tagged]:
    """Managed instance groups named from a run key, in each zone of the region."""
    fleet, out = fleet_of(backend), []
    for zone in fleet.zones:
        for g in fleet._client("groups").list(project=fleet.project, zone=zone):
            if digest := digest_in_name(str(g.name)):
                created = timestamp(g.creation_timestamp)
                out.append(Tagged("mig", str(g.name), zone, digest, None, created, f"size {g.target_size}"))
    return out


register_lister("gcp", "pubsub_topic", _list_topics)
register_lister("gcp", "pubsub_subscription", _list_subscriptions)
register_lister("gcp", "instance_template", _list_templates)
register_lister("gcp", "mig", _list_groups)
