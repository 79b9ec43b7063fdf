"""The four cloud names, which provider serves each: the one place they are listed (stdlib only).

Both sides read it: the operator's parse-time checks and the agent on the instance (it ships in the
agent zip). ``clouds.registry`` maps a name to the provider's backend on the Airflow side.
"""

from __future__ import annotations

from dataclasses import dataclass

# The studio tool's names (see docs/design.md), mapped to the provider that serves them.
CLOUDS: dict[str, str] = {"ec2": "aws", "ec2spot": "aws", "gcloud": "gcp", "gcspot": "gcp"}
AWS_CLOUDS: frozenset[str] = frozenset(c for c, p in CLOUDS.items() if p == "aws")
GCP_CLOUDS: frozenset[str] = frozenset(c for c, p in CLOUDS.items() if p == "gcp")
SPOT_CLOUDS: frozenset[str] = frozenset({"ec2spot", "gcspot"})


@dataclass(frozen=True)
class Provider:
    """What the parse-time code says and checks about one provider: looked up here, never branched on.

    Words for messages, the run folder's storage, where instances live; the provider's own rules
    (machine shapes, zones, console URLs) live in its modules (``catalog.gce`` / ``catalog.ec2``,
    ``links.console``), found through ``name``.
    """

    name: str  # "aws" / "gcp": the key of the per-provider tables
    compute: str  # the instance service's name in messages: "EC2" / "GCE"
    article: str  # "an" / "a": "an EC2 type", "a GCE zone"
    scheme: str  # the run folder's storage URI scheme: "s3" / "gs"
    storage: str  # "Amazon S3" / "Google Cloud Storage"
    bucket_kind: str  # "an S3" / "a Cloud Storage" (bucket name ...)
    bucket_chars: str  # the characters its bucket names may have, in words
    dotted_bucket_max: int  # the longest bucket name with dots (Cloud Storage: domain-named buckets)
    location: str  # where instances are described and deleted: "region" / "zone"
    projects: bool  # runs in a project of the account (``project_id``): Google Cloud
    other: str  # a cloud of the other provider, for "is a GCE zone, not one of cloud='ec2'" hints
    instance_id_re: str  # an instance id (EC2) or VM name (GCE)
    instance_id_forms: str  # how it is written, for messages

    @property
    def with_article(self) -> str:
        """'an EC2' / 'a GCE'."""
        return f"{self.article} {self.compute}"

    @property
    def clouds(self) -> tuple[str, ...]:
        return tuple(c for c, p in CLOUDS.items() if p == self.name)

    @property
    def uri_prefix(self) -> str:
        return f"{self.scheme}://"


PROVIDERS: dict[str, Provider] = {
    "aws": Provider(
        name="aws",
        compute="EC2",
        article="an",
        scheme="s3",
        storage="Amazon S3",
        bucket_kind="an S3",
        bucket_chars="lowercase letters, digits, '.' and '-'",
        dotted_bucket_max=63,
        location="region",
        projects=False,
        other="gcloud",
        instance_id_re=r"i-[0-9a-f]{8,17}",
        instance_id_forms="a list of instance ids, e.g. ['i-0123456789abcdef0']",
    ),
    "gcp": Provider(
        name="gcp",
        compute="GCE",
        article="a",
        scheme="gs",
        storage="Google Cloud Storage",
        bucket_kind="a Cloud Storage",
        bucket_chars="lowercase letters, digits, '.', '-' and '_'",
        dotted_bucket_max=222,
        location="zone",
        projects=True,
        other="ec2",
        instance_id_re=r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?",
        instance_id_forms="a list of VM names, e.g. ['trainer-1']",
    ),
}
SCHEMES: dict[str, Provider] = {p.scheme: p for p in PROVIDERS.values()}


def provider(cloud: str) -> Provider:
    """The record of the provider that serves ``cloud``; raises naming the accepted names otherwise."""
    return PROVIDERS[provider_of(cloud)]


def provider_of(cloud: str) -> str:
    """``aws`` or ``gcp`` for a cloud name; raises naming the accepted names otherwise."""
    try:
        return CLOUDS[cloud]
    except KeyError:
        raise ValueError(f"cloud={cloud!r} is not valid: use one of {', '.join(CLOUDS)}") from None


def conn_id_for(cloud: str, aws_conn_id: str | None, gcp_conn_id: str | None) -> str | None:
    """The connection of the provider that serves ``cloud``."""
    return {"aws": aws_conn_id, "gcp": gcp_conn_id}[provider_of(cloud)]


def location_for(cloud: str, region: str | None, zone: str | None) -> str | None:
    """Where instances are described and deleted: EC2 per region, GCE per zone."""
    return {"region": region, "zone": zone}[provider(cloud).location]
