"""Console URLs of what a run makes: the instance, the run folder and a fleet's group.

Pure string building from plain data (the ``ConsoleTarget`` a task pushes to XCom), so a link costs no
cloud call, works in the task, in ``finalize`` and for any reader of the XCom, and is testable alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypedDict
from urllib.parse import quote

from airflow_cloudtrain.contract.clouds import CLOUDS, PROVIDERS, SCHEMES, Provider

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


def s3_folder_url(bucket: str, prefix: str, region: str | None, project: str | None) -> str:
    where = f"region={region}&" if region else ""
    path = f"&prefix={quote(prefix + '/', safe='/')}" if prefix else ""
    return f"https://s3.console.aws.amazon.com/s3/buckets/{_q(bucket)}?{where}showversions=false{path}"


def gcs_folder_url(bucket: str, prefix: str, region: str | None, project: str | None) -> str:
    path = f"/{quote(prefix, safe='/')}" if prefix else ""
    return f"{GCP_CONSOLE}/storage/browser/{_q(bucket)}{path}{_project_query(project)}"


class Console(NamedTuple):
    """One provider's console pages: (project, where, name) -> URL, ``where`` being the instances'
    location (``Provider.location``: a region on EC2, a zone on GCE)."""

    instance: Callable[[str | None, str, str], str]
    group: Callable[[str | None, str, str], str]
    folder: Callable[[str, str, str | None, str | None], str]  # (bucket, prefix, region, project)


CONSOLES: dict[str, Console] = {
    "aws": Console(
        lambda project, region, iid: ec2_instance_url(region, iid),
        lambda project, region, name: asg_url(region, name),
        s3_folder_url,
    ),
    "gcp": Console(gce_instance_url, mig_url, gcs_folder_url),
}


def folder_url(run_uri: str, region: str | None = None, project: str | None = None) -> str:
    """The run folder in the S3 or Cloud Storage browser ("" for anything else)."""
    scheme, _, rest = run_uri.partition("://")
    bucket, _, prefix = rest.partition("/")
    facts = SCHEMES.get(scheme)
    if not bucket or facts is None:
        return ""
    return CONSOLES[facts.name].folder(bucket, prefix.strip("/"), region, project)


def _facts(target: ConsoleTarget) -> Provider | None:
    name = CLOUDS.get(target.get("cloud") or "")
    return PROVIDERS[name] if name else None


def _page(target: ConsoleTarget, name: str | None, page: str) -> str:
    """The console page (``instance`` or ``group``) of ``name`` where the target's instances are."""
    facts = _facts(target)
    where = target.get(facts.location) if facts else None
    if not name or facts is None or not where:
        return ""
    build: Callable[[str | None, str, str], str] = getattr(CONSOLES[facts.name], page)
    return build(target.get("project"), str(where), name)


def instance_url(target: ConsoleTarget) -> str:
    return _page(target, target.get("instance_id"), "instance")


def run_folder_url(target: ConsoleTarget) -> str:
    uri = target.get("run_uri")
    return folder_url(uri, target.get("region"), target.get("project")) if uri else ""


def group_url(target: ConsoleTarget) -> str:
    return _page(target, target.get("group"), "group")


def target_of(value: Any) -> ConsoleTarget | None:
    """The XCom value back as a target (anything else, e.g. a missing XCom, is None)."""
    return value if isinstance(value, dict) and isinstance(value.get("cloud"), str) else None  # type: ignore[return-value]
