"""Console URLs of what a run makes: the instance, the run folder and a fleet's group.

Pure string building from plain data (the ``ConsoleTarget`` a task pushes to XCom), so a link costs no
cloud call, works in the task, in ``finalize`` and for any reader of the XCom, and is testable alone.
"""

from __future__ import annotations

from typing import Any, TypedDict
from urllib.parse import quote

AWS_CLOUDS = ("ec2", "ec2spot")
GCP_CONSOLE = "https://console.cloud.google.com"


class ConsoleTarget(TypedDict, total=False):
    """What a task made, as plain JSON (the ``cloudtrain_console`` XCom)."""

    cloud: str  # ec2, ec2spot, gcloud, gcspot
    region: str | None
    zone: str | None
    project: str | None  # GCP only
    instance_id: str | None  # EC2 id or GCE VM name
    run_uri: str | None  # s3://bucket/path or gs://bucket/path
    group: str | None  # Auto Scaling group / managed instance group name


def _q(text: str) -> str:
    return quote(text, safe="")


def _aws_home(region: str) -> str:
    return f"https://{region}.console.aws.amazon.com"


def _project_query(project: str | None, first: bool = True) -> str:
    return f"{'?' if first else '&'}project={_q(project)}" if project else ""


def ec2_instance_url(region: str, instance_id: str) -> str:
    return f"{_aws_home(region)}/ec2/home?region={region}#InstanceDetails:instanceId={_q(instance_id)}"


def gce_instance_url(project: str | None, zone: str, name: str) -> str:
    return f"{GCP_CONSOLE}/compute/instancesDetail/zones/{_q(zone)}/instances/{_q(name)}{_project_query(project)}"


def asg_url(region: str, name: str) -> str:
    return f"{_aws_home(region)}/ec2/home?region={region}#AutoScalingGroupDetails:id={_q(name)};view=details"


def mig_url(project: str | None, zone: str, name: str) -> str:
    return f"{GCP_CONSOLE}/compute/instanceGroups/details/{_q(zone)}/{_q(name)}{_project_query(project)}"


def folder_url(run_uri: str, region: str | None = None, project: str | None = None) -> str:
    """The run folder in the S3 or Cloud Storage browser ("" for anything else)."""
    scheme, _, rest = run_uri.partition("://")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not bucket:
        return ""
    if scheme == "s3":
        where = f"region={region}&" if region else ""
        path = f"&prefix={quote(prefix + '/', safe='/')}" if prefix else ""
        return f"https://s3.console.aws.amazon.com/s3/buckets/{_q(bucket)}?{where}showversions=false{path}"
    if scheme == "gs":
        path = f"/{quote(prefix, safe='/')}" if prefix else ""
        return f"{GCP_CONSOLE}/storage/browser/{_q(bucket)}{path}{_project_query(project)}"
    return ""


def _is_aws(target: ConsoleTarget) -> bool:
    return target.get("cloud") in AWS_CLOUDS


def instance_url(target: ConsoleTarget) -> str:
    iid, region, zone = target.get("instance_id"), target.get("region"), target.get("zone")
    if not iid:
        return ""
    if _is_aws(target):
        return ec2_instance_url(region, iid) if region else ""
    return gce_instance_url(target.get("project"), zone, iid) if zone else ""


def run_folder_url(target: ConsoleTarget) -> str:
    uri = target.get("run_uri")
    return folder_url(uri, target.get("region"), target.get("project")) if uri else ""


def group_url(target: ConsoleTarget) -> str:
    name, region, zone = target.get("group"), target.get("region"), target.get("zone")
    if not name:
        return ""
    if _is_aws(target):
        return asg_url(region, name) if region else ""
    return mig_url(target.get("project"), zone, name) if zone else ""


def target_of(value: Any) -> ConsoleTarget | None:
    """The XCom value back as a target (anything else, e.g. a missing XCom, is None)."""
    return value if isinstance(value, dict) and isinstance(value.get("cloud"), str) else None  # type: ignore[return-value]
