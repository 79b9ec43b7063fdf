"""The per-cloud launch arguments (``LaunchOptions``): checked at DAG parse time, against the cloud
once it is known (at parse time, or after rendering when ``cloud`` is a template).

EC2's arguments on a GCE run (and GCE's on an EC2 run) would be silently ignored: a key pair that
never reaches the VM, a volume that is never attached, a role the instance never gets. Each fails
naming the argument and what the other cloud uses instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.contract.clouds import CLOUDS, provider
from airflow_cloudtrain.operators.checks import (
    check_bool,
    check_clean_text,
    check_conn_id,
    check_optional_str,
    check_whole,
    parse_project_id,
)

MAX_LAUNCH_ATTEMPTS = 100
MAX_USER_TAGS = 30  # EC2: 50 tags a resource; the run's own cloudtrain- tags take about 12
AMI_RE = r"ami-[0-9a-f]{8,17}|resolve:ssm:/\S+"
GCE_IMAGE_RE = r"(https://www\.googleapis\.com/compute/v1/)?projects/[a-z][-a-z0-9.:]*/global/images/(family/)?[a-z][-a-z0-9]*"
_RESERVED_TAG_PREFIXES = ("aws:", "cloudtrain-")

# argument -> what it is for, and what the other cloud uses instead
AWS_ONLY = {
    "key_name": "an EC2 key pair; GCE VMs take SSH keys from project/instance metadata or OS Login",
    "subnet_id": "an EC2 subnet; on GCE use subnetwork=",
    "security_group_ids": "EC2 security groups; on GCE firewall rules apply by network and tags",
    "iam_instance_profile": "an EC2 instance role; on GCE use service_account=",
    "volume_id": "an EBS volume to attach; GCE persistent disks are not attached by this operator",
}
GCP_ONLY = {
    "service_account": "the GCE VM's service account; on EC2 use iam_instance_profile=",
}


@dataclass(frozen=True)
class LaunchRules:
    """One provider's launch arguments: those only it takes, its image form, its tag keys' rule."""

    only: dict[str, str]  # argument -> what it is for, and what the other provider uses instead
    image_re: str
    image_hint: str
    tag_key_re: str | None = None  # None: any key parse_tags took
    tag_key_rule: str = ""


LAUNCH_RULES: dict[str, LaunchRules] = {
    "aws": LaunchRules(AWS_ONLY, AMI_RE, "an AMI id ('ami-0123456789abcdef0') on EC2"),
    "gcp": LaunchRules(
        GCP_ONLY,
        GCE_IMAGE_RE,
        "a GCE image ('projects/debian-cloud/global/images/family/debian-12') on GCE",
        r"[a-z][a-z0-9_-]{0,62}",
        "GCE labels keys are lowercase letters, digits, '_' and '-', starting with a letter, at most 63 "
        "characters (values are lower-cased for you), e.g. {'team': 'ml'}",
    ),
}


def parse_security_group_ids(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, str) and re.fullmatch(r"sg-[0-9a-f]{1,17}", v) for v in value
    ):
        return list(value)
    hint = " (one string is not a list: wrap it, security_group_ids=[...])" if isinstance(value, str) else ""
    raise ValueError(
        f"security_group_ids={value!r} is not valid{hint}: use a list of security group ids, "
        "e.g. ['sg-0123456789abcdef0']"
    )


def parse_tags(value: Any) -> dict[str, str]:
    """EC2 tags / GCE labels the run's resources get besides the run's own."""
    if value is None:
        return {}
    forms = "a dict of string keys (up to 128 characters) to string values (up to 256), e.g. {'team': 'ml'}"
    if not isinstance(value, dict):
        raise ValueError(f"tags={value!r} is not valid: use {forms}")
    if len(value) > MAX_USER_TAGS:
        raise ValueError(
            f"tags has {len(value)} entries: use at most {MAX_USER_TAGS} (EC2 takes 50 tags and GCE 64 labels "
            "per resource, and the run adds its own cloudtrain- ones)"
        )
    for key, item in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= 128 or not key.strip():
            raise ValueError(f"tags key {key!r} is not valid: use {forms}")
        check_clean_text(key, "tags key", forms)
        if key.lower().startswith(_RESERVED_TAG_PREFIXES):
            raise ValueError(
                f"tags key {key!r} is reserved: 'aws:' keys belong to AWS and 'cloudtrain-' keys to this "
                "operator (it finds and releases the run's resources by them); use another key"
            )
        if not isinstance(item, str) or len(item) > 256:
            raise ValueError(f"tags[{key!r}]={item!r} is not valid: use {forms} (write {str(item)[:256]!r})")
        check_clean_text(item, f"tags[{key!r}]", forms)
    return dict(value)


def parse_provisioning(value: Any) -> str | None:
    if value in (None, "spot", "preemptible"):
        return value
    raise ValueError(f"provisioning={value!r} is not valid: use 'spot' or 'preemptible' (gcspot only)")


def parse_launch_args(args: dict[str, Any]) -> dict[str, Any]:
    """Each argument on its own (cloud-free forms); ``check_launch_for_cloud`` checks the rest."""
    return {
        "image_id": check_optional_str(
            args.get("image_id"),
            "image_id",
            rf"{AMI_RE}|{GCE_IMAGE_RE}",
            "an AMI id ('ami-0123456789abcdef0', or 'resolve:ssm:/parameter') on EC2, or a GCE image "
            "('projects/debian-cloud/global/images/family/debian-12') on GCE",
        ),
        "key_name": check_optional_str(
            args.get("key_name"),
            "key_name",
            r"[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?",
            "the name of an EC2 key pair",
        ),
        "subnet_id": check_optional_str(
            args.get("subnet_id"),
            "subnet_id",
            r"subnet-[0-9a-f]{1,17}",
            "a subnet id such as 'subnet-0123abcd'",
        ),
        "security_group_ids": parse_security_group_ids(args.get("security_group_ids")),
        "iam_instance_profile": check_optional_str(
            args.get("iam_instance_profile"),
            "iam_instance_profile",
            r"[\w+=,.@-]{1,128}|arn:aws[\w-]*:iam::\d{12}:instance-profile/[\w+=,.@/-]{1,128}",
            "an instance profile name ('training-instance') or its ARN",
        ),
        "tags": parse_tags(args.get("tags")),
        "volume_id": check_optional_str(
            args.get("volume_id"),
            "volume_id",
            r"vol-[0-9a-f]{1,17}",
            "an EBS volume id such as 'vol-0123abcd'",
        ),
        "service_account": check_optional_str(
            args.get("service_account"),
            "service_account",
            r"default|[^@\s]+@[^@\s]+\.[a-z.]+",
            "a service account e-mail such as 'trainer@my-project.iam.gserviceaccount.com'",
        ),
        "provisioning": parse_provisioning(args.get("provisioning")),
        "max_launch_attempts": check_whole(
            args.get("max_launch_attempts", 6), "max_launch_attempts", 1, MAX_LAUNCH_ATTEMPTS
        ),
        "live_prices": check_bool(args.get("live_prices", True), "live_prices"),
    }


def check_launch_for_cloud(cloud: str, options: Any) -> None:
    """The arguments given must be ones ``cloud`` uses (``options``: a ``LaunchOptions``)."""
    own, other = provider(cloud), provider(provider(cloud).other)
    rules, other_rules = LAUNCH_RULES[own.name], LAUNCH_RULES[other.name]
    for name, what in other_rules.only.items():
        value = getattr(options, name)
        if value:
            raise ValueError(
                f"{name}={value!r} is not valid with cloud={cloud!r}: {name} is "
                f"{other.compute}-only ({what}); leave it out, or use cloud="
                + " or ".join(repr(c) for c in own.clouds)
            )
    image_id = options.image_id
    # parse_launch_args took one of the two forms: the other provider's is the mistake
    if image_id and re.fullmatch(other_rules.image_re, image_id):
        raise ValueError(f"image_id={image_id!r} is not valid with cloud={cloud!r}: use {rules.image_hint}")
    if rules.tag_key_re is not None:
        for key in options.tags:
            if not re.fullmatch(rules.tag_key_re, key):
                raise ValueError(f"tags key {key!r} is not valid with cloud={cloud!r}: {rules.tag_key_rule}")
    if options.provisioning and cloud != "gcspot":
        raise ValueError(
            f"provisioning={options.provisioning!r} is not valid with cloud={cloud!r}: it chooses between "
            "GCE Spot and preemptible VMs, so it applies to cloud='gcspot' only"
            + (" (cloud='gcloud' is on-demand)" if cloud == "gcloud" else " (EC2 spot is cloud='ec2spot')")
        )


def check_connection_args(aws_conn_id: Any, gcp_conn_id: Any, project_id: Any, cloud: Any = None) -> None:
    """Connection ids are names; ``project_id`` a Google Cloud project id (None: the connection's),
    given only where the run is on Google Cloud (``cloud``: None while it is a template)."""
    check_conn_id(aws_conn_id, "aws_conn_id", "aws_default", optional=True)
    check_conn_id(gcp_conn_id, "gcp_conn_id", "google_cloud_default", optional=False)
    parse_project_id(project_id)
    name = cloud.strip().lower() if isinstance(cloud, str) else None
    if project_id not in (None, "") and name in CLOUDS and not provider(name).projects:
        other = provider(provider(name).other)
        raise ValueError(
            f"project_id={project_id!r} is not valid with cloud={cloud!r}: project_id is {other.compute}-only "
            f"(the Google Cloud project to run in); leave it out, or use cloud="
            + " or ".join(repr(c) for c in other.clouds)
        )
