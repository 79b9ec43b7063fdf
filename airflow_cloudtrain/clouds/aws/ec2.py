"""EC2 behind the cloud interface: boto3 calls and the mapping of EC2 error codes onto ours."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from airflow_cloudtrain.clouds.aws.errors import map_client_error
from airflow_cloudtrain.contract.errors import InvalidRequest
from airflow_cloudtrain.contract.runs import TAG_PRICE, TAG_RUN, TAG_RUN_KEY, TAG_RUN_URI
from airflow_cloudtrain.core.cloud import (
    ALIVE_STATES,
    ENDED_STATES,
    STOPPED,
    STOPPING,
    TERMINATED,
    Cloud,
    Instance,
    LaunchRequest,
)
from airflow_cloudtrain.core.inventory import Tagged, price_of, register_lister

if TYPE_CHECKING:
    from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

log = logging.getLogger(__name__)

SPOT_INTERRUPTION_REASONS = frozenset(
    {"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown", "Server.SpotInstanceHibernation"}
)

# Public SSM parameters for default images: AL2023 for CPU, the Deep Learning AMI (NVIDIA driver,
# docker with the NVIDIA container toolkit) for GPU instances.
CPU_IMAGE_PARAM = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
GPU_IMAGE_PARAM = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
)
DESCRIBE_BATCH = 1000  # DescribeInstances accepts up to 1,000 ids per call
FILTER_BATCH = 200  # values per filter


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def instance_shape(request: LaunchRequest, image: str, root_device: str) -> dict[str, Any]:
    """The secure launch shape shared by RunInstances and a fleet's launch template: IMDSv2 only,
    an encrypted root volume, shutdown = terminate, run-key tags on instance and volume, and no key
    pair or security group unless the user asked for one."""
    shape: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": request.offer.instance_type,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 2,
        },
        "BlockDeviceMappings": [
            {
                "DeviceName": root_device,
                "Ebs": {
                    "VolumeSize": request.disk_gib,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": _tag_list(request.tags)},
            {"ResourceType": "volume", "Tags": _tag_list(request.tags)},
        ],
    }
    if request.security_group_ids:
        shape["SecurityGroupIds"] = list(request.security_group_ids)
    if request.key_name:
        shape["KeyName"] = request.key_name
    if request.iam_instance_profile:
        key = "Arn" if request.iam_instance_profile.startswith("arn:") else "Name"
        shape["IamInstanceProfile"] = {key: request.iam_instance_profile}
    return shape


def to_instance(raw: dict[str, Any]) -> Instance:
    """One DescribeInstances entry as our record."""
    reason = (raw.get("StateReason") or {}).get("Code", "")
    launch: Any = raw.get("LaunchTime")
    return Instance(
        id=raw["InstanceId"],
        state=raw["State"]["Name"],
        instance_type=raw.get("InstanceType", ""),
        zone=(raw.get("Placement") or {}).get("AvailabilityZone"),
        spot=raw.get("InstanceLifecycle") == "spot",
        launch_time=launch.timestamp() if hasattr(launch, "timestamp") else None,
        state_reason=reason,
        preempted=reason in SPOT_INTERRUPTION_REASONS,
        tags={t["Key"]: t["Value"] for t in raw.get("Tags", [])},
        private_ip=raw.get("PrivateIpAddress") or None,
    )


def _ridden_out(call: Callable[[], Any]) -> Any:
    """A launch's calls through throttling and 5xx for 3 minutes: RunInstances (its client token makes
    a repeated call safe) and its lookups (the default image, its root device), where botocore's own 4
    retries alone failed a gang's launch under 30% throttling (fault campaign s016)."""
    from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry

    return call_with_retry(call, TransientBudget(budget_s=180.0))


class AwsCloud(Cloud):
    """EC2 in one region, through clients the caller built (from an Airflow connection)."""

    name = "aws"

    def __init__(
        self, ec2_client: Any, region: str, ssm_client: Any | None = None, launch_client: Any | None = None
    ) -> None:
        self.ec2 = ec2_client
        self.ssm = ssm_client
        self.region = region
        # RunInstances goes through a client without SDK retries: EC2 answers a capacity shortage
        # with HTTP 500, which botocore would retry ~5 times (about 10 s) before the launcher could
        # move on to the next zone or offer. Throttling is retried below instead (the client token
        # makes a repeated RunInstances safe).
        self.launch_client = launch_client or ec2_client

    def default_image(self, gpus: int) -> str:
        param = GPU_IMAGE_PARAM if gpus else CPU_IMAGE_PARAM
        if self.ssm is None:
            raise InvalidRequest("no image_id given and no SSM client to look up the default image")
        ssm = self.ssm
        try:
            return str(_ridden_out(lambda: ssm.get_parameter(Name=param))["Parameter"]["Value"])
        except Exception as err:
            raise InvalidRequest(
                f"no image_id given and the default image parameter {param} is not readable in "
                f"{self.region} ({err}); pass image_id="
            ) from err

    def root_device(self, image_id: str) -> str:
        """The image's root device (``/dev/xvda`` on Amazon Linux, ``/dev/sda1`` on Ubuntu): mapping
        another name would add an empty volume and leave the real root unsized and unencrypted."""
        try:
            images = _ridden_out(lambda: self.ec2.describe_images(ImageIds=[image_id]))["Images"]
        except Exception as err:
            raise map_client_error(err) from err
        return (images[0].get("RootDeviceName") if images else None) or "/dev/xvda"

    def launch(self, request: LaunchRequest) -> Instance:
        offer = request.offer
        image = request.image_id or self.default_image(offer.gpus)
        kwargs: dict[str, Any] = {
            **instance_shape(request, image, self.root_device(image)),
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": request.client_token,
            "UserData": request.user_data,
        }
        if request.zone:
            kwargs["Placement"] = {"AvailabilityZone": request.zone}
        if request.placement_group:  # a gang's cluster placement group (``clouds.aws.gang_net``)
            kwargs.setdefault("Placement", {})["GroupName"] = request.placement_group
        if request.subnet_id:
            kwargs["SubnetId"] = request.subnet_id
        if offer.is_spot:
            spot: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if request.max_price is not None:
                spot["MaxPrice"] = f"{request.max_price:.6f}"
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}

        def run() -> Any:
            try:
                return self.launch_client.run_instances(**kwargs)
            except Exception as err:
                raise map_client_error(err) from err

        response = _ridden_out(run)
        return to_instance(response["Instances"][0])

    def find(self, run_key_digest: str, ended: bool = False) -> list[Instance]:
        # a terminated EC2 instance is gone for good (only listed for a while): never in the result
        states = ALIVE_STATES | {"stopping", "stopped"} | ({"shutting-down"} if ended else set())
        filters = [
            {"Name": f"tag:{TAG_RUN_KEY}", "Values": [run_key_digest]},
            {"Name": "instance-state-name", "Values": sorted(states)},
        ]
        return list(_instances(self.ec2, Filters=filters))

    def find_run(self, run_id: str) -> list[Instance]:
        return list(_instances(self.ec2, Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_id]}]))

    def describe(self, ids: list[str]) -> dict[str, Instance]:
        return describe_instances(self.ec2, ids)

    def terminate(self, ids: list[str]) -> None:
        ids = [i for i in ids if i]
        if not ids:
            return
        try:
            self.ec2.terminate_instances(InstanceIds=ids)
        except Exception as err:
            mapped = map_client_error(err)
            if getattr(mapped, "code", "") != "InvalidInstanceID.NotFound":
                raise mapped from err

    def attach_volume(self, instance_id: str, volume_id: str) -> str:
        device = "/dev/sdf"
        waiter = self.ec2.get_waiter("instance_running")
        waiter.wait(InstanceIds=[instance_id], WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        try:
            self.ec2.attach_volume(InstanceId=instance_id, VolumeId=volume_id, Device=device)
        except Exception as err:
            raise map_client_error(err) from err
        return device


def aws_cloud(hook: CloudTrainAwsHook) -> AwsCloud:
    """EC2 in the hook's region, from its connection: RunInstances through a client without SDK
    retries (see ``AwsCloud``), SSM for the default images."""
    from botocore.config import Config

    no_retries = (hook.config or Config()).merge(
        Config(retries={"mode": "standard", "total_max_attempts": 1})
    )
    return AwsCloud(
        hook.conn, hook.conn_region_name, hook.client("ssm"), hook.client("ec2", config=no_retries)
    )


def _instances(ec2: Any, **kwargs: Any) -> Iterator[Instance]:
    """Every instance of a paginated DescribeInstances."""
    for page in ec2.get_paginator("describe_instances").paginate(**kwargs):
        yield from instances_of(page)


def instances_of(response: dict[str, Any]) -> Iterator[Instance]:
    """The instances of one DescribeInstances response (page)."""
    for reservation in response["Reservations"]:
        for raw in reservation["Instances"]:
            yield to_instance(raw)


def id_chunks(ids: list[str]) -> list[list[str]]:
    """Unique ids in chunks of the API's limit for ``InstanceIds``."""
    unique = sorted(set(ids))
    return [unique[i : i + DESCRIBE_BATCH] for i in range(0, len(unique), DESCRIBE_BATCH)]


def id_filters(chunk: list[str]) -> list[list[dict[str, Any]]]:
    """The filters that describe ``chunk`` without failing on ids EC2 rejects."""
    return [
        [{"Name": "instance-id", "Values": chunk[i : i + FILTER_BATCH]}]
        for i in range(0, len(chunk), FILTER_BATCH)
    ]


def rejects_an_id(err: Exception) -> bool:
    """An id EC2 no longer knows (or a malformed one) fails the whole call for every id in it."""
    return str(getattr(map_client_error(err), "code", "")).startswith("InvalidInstanceID")


def with_missing(ids: list[str], found: dict[str, Instance]) -> dict[str, Instance]:
    """Ids the cloud did not report: never existed, or gone for over an hour. Their own answer."""
    for missing in set(ids) - set(found):
        found[missing] = Instance(
            id=missing,
            state=TERMINATED,
            instance_type="",
            zone=None,
            spot=False,
            state_reason="not found",
            missing=True,
        )
    return found


def describe_ended(ec2: Any, ids: list[str]) -> dict[str, Instance]:
    """Only the instances of ``ids`` that stopped or ended: what a run's wait needs from EC2 (the
    agent's beacon says the rest). Asking for less keeps the response, and parsing it, small at a
    thousand watched instances. An id EC2 does not know comes back ``missing``."""
    ended = [{"Name": "instance-state-name", "Values": sorted(ENDED_STATES | {STOPPING, STOPPED})}]
    out: dict[str, Instance] = {}
    for chunk in id_chunks(ids):
        try:
            out.update((i.id, i) for i in _instances(ec2, InstanceIds=chunk, Filters=ended))
        except Exception as err:
            if not rejects_an_id(err):
                raise map_client_error(err) from err
            # rare (an instance gone for an hour): the full answer tells unknown ids from running ones
            full = describe_instances(ec2, chunk)
            out.update(
                (i, inst) for i, inst in full.items() if inst.missing or inst.state in ended[0]["Values"]
            )
    return out


def describe_instances(ec2: Any, ids: list[str]) -> dict[str, Instance]:
    """Describe many ids with one call per 1,000; when one id fails the call, re-describe that chunk
    by filter (which ignores such ids). The async twin is ``hooks.aws.CloudTrainAwsHook.describe_async``."""
    out: dict[str, Instance] = {}
    for chunk in id_chunks(ids):
        try:
            found = list(_instances(ec2, InstanceIds=chunk))
        except Exception as err:
            if not rejects_an_id(err):
                raise map_client_error(err) from err
            found = [i for filters in id_filters(chunk) for i in _instances(ec2, Filters=filters)]
        out.update((i.id, i) for i in found)
    return with_missing(ids, out)


# --- cloudtrain gc: every instance of ours in the region, whatever its run -----------------------


class _Ec2Backend(Protocol):
    """What the lister needs of ``AwsRunBackend`` (named here: the backend module imports this one)."""

    @property
    def cloud(self) -> AwsCloud: ...


def list_tagged(backend: _Ec2Backend) -> list[Tagged]:
    """Every instance carrying the run key tag, any run, not yet terminated (a stopped one still
    bills its volumes): one paginated DescribeInstances."""
    cloud = backend.cloud
    states = sorted(ALIVE_STATES | {STOPPING, STOPPED, "shutting-down"})
    filters = [
        {"Name": "tag-key", "Values": [TAG_RUN_KEY]},
        {"Name": "instance-state-name", "Values": states},
    ]
    return [
        Tagged(
            "instance",
            i.id,
            cloud.region,
            i.tags.get(TAG_RUN_KEY),
            i.tags.get(TAG_RUN_URI) or None,
            i.launch_time,
            i.state,
            price_of(i.tags, TAG_PRICE),
        )
        for i in _instances(cloud.ec2, Filters=filters)
    ]


register_lister("aws", "instance", list_tagged)
