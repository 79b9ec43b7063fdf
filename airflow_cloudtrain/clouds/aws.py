"""EC2 behind the cloud interface: boto3 calls and the mapping of EC2 error codes onto ours."""

from __future__ import annotations

import base64
import logging
from typing import Any

from airflow_cloudtrain.clouds.base import (
    ALIVE_STATES,
    TERMINATED,
    Cloud,
    Instance,
    LaunchRequest,
)
from airflow_cloudtrain.clouds.errors import CapacityUnavailable, CloudError, InvalidRequest, QuotaExceeded
from airflow_cloudtrain.runs import TAG_MANAGED, TAG_RUN, TAG_RUN_KEY

log = logging.getLogger(__name__)

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "Unsupported",  # the type is not offered in this zone
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",
    }
)
QUOTA_CODES = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"})
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


def map_client_error(err: Exception) -> Exception:
    """Turn a botocore ClientError into our vocabulary (others pass through unchanged)."""
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return err
    code = response.get("Error", {}).get("Code", "")
    message = response.get("Error", {}).get("Message", str(err))
    if code in CAPACITY_CODES:
        return CapacityUnavailable(message, code)
    if code in QUOTA_CODES:
        return QuotaExceeded(message, code)
    if code.startswith(("Invalid", "Missing", "Unknown")) or code in {"UnauthorizedOperation"}:
        return InvalidRequest(message, code)
    return CloudError(message, code)


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def to_instance(raw: dict[str, Any]) -> Instance:
    """One DescribeInstances entry as our record."""
    reason = (raw.get("StateReason") or {}).get("Code", "")
    launch = raw.get("LaunchTime")
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
    )


class AwsCloud(Cloud):
    """EC2 in one region, through clients the caller built (from an Airflow connection)."""

    name = "aws"

    def __init__(self, ec2_client: Any, region: str, ssm_client: Any | None = None) -> None:
        self.ec2 = ec2_client
        self.ssm = ssm_client
        self.region = region

    def default_image(self, gpus: int) -> str:
        param = GPU_IMAGE_PARAM if gpus else CPU_IMAGE_PARAM
        if self.ssm is None:
            raise InvalidRequest("no image_id given and no SSM client to look up the default image")
        try:
            return self.ssm.get_parameter(Name=param)["Parameter"]["Value"]
        except Exception as err:
            raise InvalidRequest(
                f"no image_id given and the default image parameter {param} is not readable in "
                f"{self.region} ({err}); pass image_id="
            ) from err

    def root_device(self, image_id: str) -> str:
        """The image's root device (``/dev/xvda`` on Amazon Linux, ``/dev/sda1`` on Ubuntu): mapping
        another name would add an empty volume and leave the real root unsized and unencrypted."""
        try:
            images = self.ec2.describe_images(ImageIds=[image_id])["Images"]
        except Exception as err:
            raise map_client_error(err) from err
        return (images[0].get("RootDeviceName") if images else None) or "/dev/xvda"

    def launch(self, request: LaunchRequest) -> Instance:
        offer = request.offer
        image = request.image_id or self.default_image(offer.gpus)
        kwargs: dict[str, Any] = {
            "ImageId": image,
            "InstanceType": offer.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": request.client_token,
            "UserData": request.user_data,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": 2,
            },
            "BlockDeviceMappings": [
                {
                    "DeviceName": self.root_device(image),
                    "Ebs": {
                        "VolumeSize": request.disk_gib,
                        "VolumeType": "gp3",
                        "Encrypted": True,
                        "DeleteOnTermination": True,
                    },
                }  # fmt: skip
            ],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list(request.tags)},
                {"ResourceType": "volume", "Tags": _tag_list(request.tags)},
            ],
        }
        if request.zone:
            kwargs["Placement"] = {"AvailabilityZone": request.zone}
        if request.subnet_id:
            kwargs["SubnetId"] = request.subnet_id
        if request.security_group_ids:
            kwargs["SecurityGroupIds"] = list(request.security_group_ids)
        if request.key_name:
            kwargs["KeyName"] = request.key_name
        if request.iam_instance_profile:
            key = "Arn" if request.iam_instance_profile.startswith("arn:") else "Name"
            kwargs["IamInstanceProfile"] = {key: request.iam_instance_profile}
        if offer.is_spot:
            spot: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if request.max_price is not None:
                spot["MaxPrice"] = f"{request.max_price:.6f}"
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        try:
            response = self.ec2.run_instances(**kwargs)
        except Exception as err:
            raise map_client_error(err) from err
        return to_instance(response["Instances"][0])

    def find(self, run_key_digest: str) -> list[Instance]:
        filters = [
            {"Name": f"tag:{TAG_RUN_KEY}", "Values": [run_key_digest]},
            {"Name": "instance-state-name", "Values": sorted(ALIVE_STATES | {"stopping", "stopped"})},
        ]
        found = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                found.extend(to_instance(raw) for raw in reservation["Instances"])
        return found

    def find_run(self, run_id: str) -> list[Instance]:
        filters = [{"Name": f"tag:{TAG_RUN}", "Values": [run_id]}]
        out = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                out.extend(to_instance(raw) for raw in reservation["Instances"])
        return out

    def find_all_managed(self) -> list[Instance]:
        """Every live instance we tagged, in this region (the emulator and leak checks use it)."""
        filters = [
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
        out = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                out.extend(to_instance(raw) for raw in reservation["Instances"])
        return out

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


def describe_instances(ec2: Any, ids: list[str]) -> dict[str, Instance]:
    """Describe many ids with one call per 1,000 (the API's limit for ``InstanceIds``).

    An id EC2 no longer knows fails the whole call (InvalidInstanceID.NotFound); only then is the
    chunk re-described by filter (200 values per filter), and ids still missing count as terminated.
    """
    out: dict[str, Instance] = {}
    unique = sorted(set(ids))
    for start in range(0, len(unique), DESCRIBE_BATCH):
        chunk = unique[start : start + DESCRIBE_BATCH]
        try:
            pages = list(ec2.get_paginator("describe_instances").paginate(InstanceIds=chunk))
        except Exception as err:
            if not getattr(map_client_error(err), "code", "").startswith("InvalidInstanceID"):
                raise map_client_error(err) from err
            pages = []  # one bad id (malformed, or long gone) must not fail the others
            for sub in range(0, len(chunk), 200):
                filters = [{"Name": "instance-id", "Values": chunk[sub : sub + 200]}]
                pages.extend(ec2.get_paginator("describe_instances").paginate(Filters=filters))
        for page in pages:
            for reservation in page["Reservations"]:
                for raw in reservation["Instances"]:
                    out[raw["InstanceId"]] = to_instance(raw)
    for missing in set(unique) - set(out):
        out[missing] = Instance(id=missing, state=TERMINATED, instance_type="", zone=None, spot=False,
                                state_reason="not found")  # fmt: skip
    return out


def decode_user_data(value: str) -> str:
    return base64.b64decode(value).decode()
