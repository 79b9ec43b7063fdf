"""A fleet on AWS: an SQS work queue (+ dead-letter queue), a launch template and an Auto Scaling group.

``AwsFleet`` is the AWS ``core.fleet.FleetBackend`` (``clouds.gcp.fleet.GcpFleet`` is its twin; the
registry picks). Each ``make_*`` goes through ``ResourceLedger.ensure`` (find by name, else make
under a write-ahead entry).

Every name comes from the run key's digest (``ct-<digest>-items``, ``ct-<digest>-dlq``, ``ct-<digest>``),
so a retried task finds what an earlier try made by name instead of making a second one, and the
resource ledger's kinds (registered at the bottom) can find and delete them with nothing but the
digest. Queues are encrypted with SQS-managed keys (SSE) and tagged with the run key; the template
carries the same secure launch shape as a single run (``clouds.aws.instance_shape``) and run-key
tags for the instances and volumes it makes, so the instance sweep finds the group's workers too.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.clouds.aws.ec2 import _tag_list, instance_shape, map_client_error, to_instance
from airflow_cloudtrain.contract.runs import TAG_RUN_KEY, TAG_RUN_URI
from airflow_cloudtrain.core.fleet import Depth, FleetMaking, FleetQueues, GroupPlan, GroupState, WorkerPlace
from airflow_cloudtrain.core.inventory import Tagged, digest_in_name, register_lister, timestamp
from airflow_cloudtrain.core.ledger import RELEASE_FIRST, Resource, ResourceKind, register_kind

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.clouds.aws.backend import AwsRunBackend
    from airflow_cloudtrain.core.cloud import Instance, LaunchRequest

log = logging.getLogger(__name__)
__all__ = ["AwsFleet", "Depth", "GroupState", "fleet_of"]

SEND_BATCH = 10  # SendMessageBatch takes up to 10 messages


def group_name(digest: str) -> str:
    return f"ct-{digest}"


def queue_name(digest: str, dead_letter: bool = False) -> str:
    return f"ct-{digest}-{'dlq' if dead_letter else 'items'}"


def _code(err: Exception) -> str:
    response = getattr(err, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _missing(err: Exception) -> bool:
    code = _code(err)
    return code in {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "InvalidLaunchTemplateName.NotFoundException",
        "InvalidLaunchTemplateId.NotFound",
    } or ("not found" in str(err).lower() and code == "ValidationError")


class AwsFleet:
    """SQS + EC2 launch templates + Auto Scaling in one region, from one connection's clients."""

    provider = "aws"
    zone: str | None = None  # the group spans the region's fitting zones
    sweep_kinds: tuple[str, ...] = ("sqs_queue", "launch_template", "asg", "instance")

    def __init__(
        self, sqs: Any, autoscaling: Any, ec2: Any, region: str, backend: AwsRunBackend | None = None
    ) -> None:
        self.sqs = sqs
        self.autoscaling = autoscaling
        self.ec2 = ec2
        self.region = region
        self.backend = backend  # its EC2 cloud looks up the default image

    def group_name(self, digest: str) -> str:
        return group_name(digest)

    # --- making, through the ledger --------------------------------------------------------------

    def make_queues(self, making: FleetMaking, lease_s: int, max_attempts: int) -> FleetQueues:
        """The dead-letter queue, then the work queue whose redrive policy points at it."""
        dead_letter = self._make_queue(making, queue_name(making.digest, True), None, lease_s, max_attempts)
        queue = self._make_queue(making, queue_name(making.digest), dead_letter, lease_s, max_attempts)
        return FleetQueues(
            queue=queue, dead_letter=dead_letter, send_to=queue, dead_letter_source=dead_letter
        )

    def _make_queue(
        self, making: FleetMaking, name: str, dead_letter: str | None, lease_s: int, max_attempts: int
    ) -> str:
        def create() -> str:
            arn = self.queue_arn(dead_letter) if dead_letter else None
            return self.create_queue(name, making.tags, lease_s, arn, max_attempts)

        url, made = making.ensure("sqs_queue", self.region, name, lambda: self.queue_url(name), create)
        if made:
            making.log.info("Created queue %s", url)
        return url

    def place(self, zone: str | None, offer: Offer) -> None:
        """Nothing to pin: the group spans the region's zones that fit."""

    def worker_settings(self, queues: FleetQueues, offer: Offer) -> WorkerPlace:
        return {}

    def make_template(self, making: FleetMaking, name: str, request: LaunchRequest) -> str:
        def create() -> str:
            if self.backend is None:
                raise RuntimeError("AwsFleet needs its run backend to make a launch template")
            aws = self.backend.cloud
            image = request.image_id or aws.default_image(request.offer.gpus)
            return self.create_template(name, request, image, aws.root_device(image))

        template_id, made = making.ensure(
            "launch_template", self.region, name, lambda: self.template_id(name), create, record=name
        )
        if made:
            making.log.info("Created launch template %s (%s)", name, template_id)
        return template_id

    def make_group(self, making: FleetMaking, plan: GroupPlan) -> None:
        def find() -> str | None:
            return plan.name if self.group(plan.name) is not None else None

        def create() -> str:
            wanted = {z for o in plan.offers for z in o.zones if o.instance_type in plan.instance_types}
            zones = [] if plan.subnet_id else self.zone_names(wanted)
            subnets = [plan.subnet_id] if plan.subnet_id else []
            self.create_group(
                plan.name,
                plan.template,
                plan.instance_types,
                plan.spot,
                plan.max_price,
                plan.desired,
                plan.max_workers,
                zones,
                subnets,
                plan.tags,
            )
            return plan.name

        _, made = making.ensure("asg", self.region, plan.name, find, create)
        if made:
            making.log.info(
                "Created group %s: %d worker(s) to start, up to %d", plan.name, plan.desired, plan.max_workers
            )
        else:
            making.log.info("Re-attached to group %s", plan.name)

    # --- queues ---------------------------------------------------------------------------------

    def queue_url(self, name: str) -> str | None:
        try:
            return str(self.sqs.get_queue_url(QueueName=name)["QueueUrl"])
        except Exception as err:
            if _missing(err):
                return None
            raise

    def create_queue(
        self, name: str, tags: dict[str, str], lease_s: int, dead_letter_arn: str | None, max_receives: int
    ) -> str:
        """A standard queue with SSE; with ``dead_letter_arn``, messages received ``max_receives``
        times without being deleted move there (a worker that vanished on the last attempt)."""
        attributes = {
            "SqsManagedSseEnabled": "true",
            "VisibilityTimeout": str(lease_s),
            "MessageRetentionPeriod": str(14 * 86400),
        }
        if dead_letter_arn:
            attributes["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": max_receives}
            )
        tag_map = {k: v[:256] for k, v in tags.items()}
        return str(self.sqs.create_queue(QueueName=name, Attributes=attributes, tags=tag_map)["QueueUrl"])

    def queue_arn(self, url: str) -> str:
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        return str(attrs["QueueArn"])

    def queue_created(self, url: str) -> str:
        """The queue's creation time: a queue made again under the same name is another queue."""
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["CreatedTimestamp"])
        return str(attrs["Attributes"].get("CreatedTimestamp", ""))

    def depth(self, url: str) -> Depth:
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return Depth(*(int(attrs.get(n, 0)) for n in names))

    def send(self, url: str, bodies: list[tuple[str, str]]) -> None:
        """(id, body) pairs, ten per call; a partly failed batch raises naming the failed ids."""
        for start in range(0, len(bodies), SEND_BATCH):
            batch = bodies[start : start + SEND_BATCH]
            entries = [{"Id": f"m{start + n}", "MessageBody": body} for n, (_, body) in enumerate(batch)]
            failed = self.sqs.send_message_batch(QueueUrl=url, Entries=entries).get("Failed") or []
            if failed:
                raise RuntimeError(f"SQS refused {len(failed)} item message(s): {failed[:3]}")

    def drain(self, url: str) -> None:
        """Delete whatever a dead try sent (no worker exists yet, so nothing else receives)."""
        while True:
            got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
            messages = got.get("Messages") or []
            if not messages:
                return
            self.sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)],
            )

    def take_dead_letters(self, url: str) -> list[tuple[str, int]]:
        """Nothing: on SQS the watch ends on an empty queue, and items without an outcome are failed."""
        return []

    def purge(self, url: str) -> None:
        self.sqs.purge_queue(QueueUrl=url)

    def delete_queue(self, url: str) -> None:
        try:
            self.sqs.delete_queue(QueueUrl=url)
        except Exception as err:
            if not _missing(err):
                raise

    # --- launch template ------------------------------------------------------------------------

    def template_id(self, name: str) -> str | None:
        try:
            found = self.ec2.describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"]
        except Exception as err:
            if _missing(err):
                return None
            raise
        return str(found[0]["LaunchTemplateId"]) if found else None

    def create_template(self, name: str, request: LaunchRequest, image: str, root_device: str) -> str:
        """The template of every worker: a single run's launch shape, user data base64 (as templates
        want it); the market (spot or on-demand) is the group's to choose, not the template's."""
        data = instance_shape(request, image, root_device)
        data["UserData"] = base64.b64encode(request.user_data.encode()).decode()
        try:
            made = self.ec2.create_launch_template(
                LaunchTemplateName=name,
                LaunchTemplateData=data,
                ClientToken=name,
                TagSpecifications=[{"ResourceType": "launch-template", "Tags": _tag_list(request.tags)}],
            )
        except Exception as err:
            raise map_client_error(err) from err
        return str(made["LaunchTemplate"]["LaunchTemplateId"])

    def delete_template(self, name: str) -> None:
        try:
            self.ec2.delete_launch_template(LaunchTemplateName=name)
        except Exception as err:
            if not _missing(err):
                raise

    # --- the Auto Scaling group -----------------------------------------------------------------

    def group(self, name: str) -> GroupState | None:
        groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
        for raw in groups.get("AutoScalingGroups", []):
            members = {i["InstanceId"]: bool(i.get("ProtectedFromScaleIn")) for i in raw.get("Instances", [])}
            return GroupState(name, int(raw["DesiredCapacity"]), int(raw["MaxSize"]), members)
        return None

    def create_group(
        self,
        name: str,
        template_id: str,
        instance_types: list[str],
        spot: bool,
        max_price: float | None,
        desired: int,
        max_size: int,
        zones: list[str],
        subnet_ids: list[str],
        tags: dict[str, str],
    ) -> None:
        """A group over every fitting offer (``instance_types``, cheapest first): spot with
        ``price-capacity-optimized`` (AWS's advice: fewest interruptions at a low price), capacity
        rebalancing on, the bid as SpotMaxPrice only when the user gave one."""
        distribution: dict[str, Any] = {
            "OnDemandBaseCapacity": 0,
            "OnDemandPercentageAboveBaseCapacity": 0 if spot else 100,
        }
        if spot:
            distribution["SpotAllocationStrategy"] = "price-capacity-optimized"
            if max_price is not None:
                distribution["SpotMaxPrice"] = f"{max_price:.6f}"
        else:
            distribution["OnDemandAllocationStrategy"] = "lowest-price"
        kwargs: dict[str, Any] = {
            "AutoScalingGroupName": name,
            "MinSize": 0,
            "MaxSize": max_size,
            "DesiredCapacity": desired,
            "CapacityRebalance": spot,
            "NewInstancesProtectedFromScaleIn": False,
            "MixedInstancesPolicy": {
                "LaunchTemplate": {
                    "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "$Latest"},
                    "Overrides": [{"InstanceType": t} for t in instance_types],
                },
                "InstancesDistribution": distribution,
            },
            "Tags": [
                {
                    "Key": k,
                    "Value": v,
                    "PropagateAtLaunch": False,
                    "ResourceId": name,
                    "ResourceType": "auto-scaling-group",
                }
                for k, v in sorted(tags.items())
            ],
        }
        if subnet_ids:
            kwargs["VPCZoneIdentifier"] = ",".join(subnet_ids)
        else:
            kwargs["AvailabilityZones"] = zones
        try:
            self.autoscaling.create_auto_scaling_group(**kwargs)
        except Exception as err:
            if _code(err) != "AlreadyExists":  # a retried call after a lost answer
                raise map_client_error(err) from err

    def zone_names(self, wanted: set[str]) -> list[str]:
        """The region's available zones among ``wanted`` (zone names or the catalog's zone ids such
        as ``use1-az6``, which map to different names in each account); all of them if none match."""
        zones = self.ec2.describe_availability_zones(Filters=[{"Name": "state", "Values": ["available"]}])[
            "AvailabilityZones"
        ]
        names = [z["ZoneName"] for z in zones if {z["ZoneName"], z.get("ZoneId")} & wanted]
        return sorted(names or [z["ZoneName"] for z in zones])

    def set_desired(self, name: str, desired: int) -> None:
        self.autoscaling.set_desired_capacity(
            AutoScalingGroupName=name, DesiredCapacity=desired, HonorCooldown=False
        )

    def replace_member(self, name: str, instance_id: str) -> None:
        """Scale-in protection off (a busy worker set it; its dead agent cannot take it off), then
        terminate it through the group without lowering the desired capacity: the group launches a
        replacement."""
        self.autoscaling.set_instance_protection(
            InstanceIds=[instance_id], AutoScalingGroupName=name, ProtectedFromScaleIn=False
        )
        self.autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=instance_id, ShouldDecrementDesiredCapacity=False
        )

    def members(self, digest: str) -> list[Instance]:
        """Every worker of the run (any state), from EC2: type, market, launch time, how it ended.
        By the run-key tag the template gives them, which stays when the group lets one go."""
        filters = [{"Name": f"tag:{TAG_RUN_KEY}", "Values": [digest]}]
        out: list[Instance] = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            out.extend(to_instance(i) for r in page["Reservations"] for i in r["Instances"])
        return out

    def delete_group(self, name: str) -> None:
        """Force-delete the group and end every member, protected or not (nothing may keep billing)."""
        state = self.group(name)
        if state is None:
            return
        try:
            self.autoscaling.update_auto_scaling_group(
                AutoScalingGroupName=name, MinSize=0, MaxSize=0, DesiredCapacity=0
            )
            self.autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        except Exception as err:
            if not _missing(err):
                raise
        alive = [
            i.id
            for i in self.members(name.removeprefix("ct-"))
            if i.state in ("pending", "running", "stopping", "stopped")
        ]
        if alive:
            self.ec2.terminate_instances(InstanceIds=alive)


def fleet_of(backend: AwsRunBackend, zone: str | None = None) -> AwsFleet:
    """The ``AwsFleet`` of an ``AwsRunBackend`` (its connection and region; a zone means nothing)."""
    hook = backend.hook
    return AwsFleet(
        hook.client("sqs"), hook.client("autoscaling"), hook.client("ec2"), backend.region or "", backend
    )


# --- ledger kinds: found by name from the run key, deleted with "not found" as done ---------------


def _find_queues(backend: AwsRunBackend, digest: str) -> list[Resource]:
    fleet = fleet_of(backend)
    found = []
    for dead_letter in (True, False):
        url = fleet.queue_url(queue_name(digest, dead_letter))
        if url:
            found.append(Resource("sqs_queue", url, fleet.region))
    return found


def _delete_queues(backend: AwsRunBackend, resources: list[Resource]) -> None:
    fleet = fleet_of(backend)
    for resource in resources:
        fleet.delete_queue(resource.id or "")


def _find_templates(backend: AwsRunBackend, digest: str) -> list[Resource]:
    fleet = fleet_of(backend)
    name = group_name(digest)
    return [Resource("launch_template", name, fleet.region)] if fleet.template_id(name) else []


def _delete_templates(backend: AwsRunBackend, resources: list[Resource]) -> None:
    fleet = fleet_of(backend)
    for resource in resources:
        fleet.delete_template(resource.id or "")


def _find_groups(backend: AwsRunBackend, digest: str) -> list[Resource]:
    fleet = fleet_of(backend)
    name = group_name(digest)
    return [Resource("asg", name, fleet.region)] if fleet.group(name) else []


def _delete_groups(backend: AwsRunBackend, resources: list[Resource]) -> None:
    fleet = fleet_of(backend)
    for resource in resources:
        fleet.delete_group(resource.id or "")


SQS_QUEUE = register_kind(ResourceKind("sqs_queue", _find_queues, _delete_queues))
LAUNCH_TEMPLATE = register_kind(ResourceKind("launch_template", _find_templates, _delete_templates))
ASG = register_kind(ResourceKind("asg", _find_groups, _delete_groups, release_order=RELEASE_FIRST))


# --- cloudtrain gc: every queue, template and group of ours in the region, whatever its run ---------


def _tag(tags: Any, key: str) -> str | None:
    """A tag's value from an API's tag list (``[{Key, Value}]``) or map."""
    if isinstance(tags, dict):
        return tags.get(key)
    return next((t.get("Value") for t in tags or [] if t.get("Key") == key), None)


def _list_queues(backend: AwsRunBackend) -> list[Tagged]:
    """Every SQS queue named ``ct-...`` that carries the run key tag (or whose name holds a digest)."""
    fleet, out = fleet_of(backend), []
    for page in fleet.sqs.get_paginator("list_queues").paginate(QueueNamePrefix="ct-"):
        for url in page.get("QueueUrls", []):
            try:
                tags = fleet.sqs.list_queue_tags(QueueUrl=url).get("Tags") or {}
                attrs = fleet.sqs.get_queue_attributes(
                    QueueUrl=url, AttributeNames=["CreatedTimestamp", "ApproximateNumberOfMessages"]
                )["Attributes"]
            except Exception as err:
                if _missing(err):  # deleted between the listing and now
                    continue
                raise
            digest = tags.get(TAG_RUN_KEY) or digest_in_name(url)
            if digest:
                depth = attrs.get("ApproximateNumberOfMessages", "?")
                out.append(
                    Tagged(
                        "sqs_queue",
                        url,
                        fleet.region,
                        digest,
                        created_at=timestamp(attrs.get("CreatedTimestamp")),
                        state=f"{depth} messages",
                    )
                )
    return out


def _list_templates(backend: AwsRunBackend) -> list[Tagged]:
    fleet, out = fleet_of(backend), []
    for page in fleet.ec2.get_paginator("describe_launch_templates").paginate():
        for raw in page.get("LaunchTemplates", []):
            name = str(raw["LaunchTemplateName"])
            digest = _tag(raw.get("Tags"), TAG_RUN_KEY) or digest_in_name(name)
            if digest:
                out.append(
                    Tagged(
                        "launch_template",
                        name,
                        fleet.region,
                        digest,
                        _tag(raw.get("Tags"), TAG_RUN_URI),
                        timestamp(raw.get("CreateTime")),
                        f"version {raw.get('LatestVersionNumber', '?')}",
                    )
                )
    return out


def _list_groups(backend: AwsRunBackend) -> list[Tagged]:
    fleet, out = fleet_of(backend), []
    for page in fleet.autoscaling.get_paginator("describe_auto_scaling_groups").paginate():
        for raw in page.get("AutoScalingGroups", []):
            name = str(raw["AutoScalingGroupName"])
            digest = _tag(raw.get("Tags"), TAG_RUN_KEY) or digest_in_name(name)
            if digest:
                members = len(raw.get("Instances", []))
                out.append(
                    Tagged(
                        "asg",
                        name,
                        fleet.region,
                        digest,
                        _tag(raw.get("Tags"), TAG_RUN_URI),
                        timestamp(raw.get("CreatedTime")),
                        f"desired {raw.get('DesiredCapacity', 0)}, {members} members",
                    )
                )
    return out


register_lister("aws", "sqs_queue", _list_queues)
register_lister("aws", "launch_template", _list_templates)
register_lister("aws", "asg", _list_groups)
