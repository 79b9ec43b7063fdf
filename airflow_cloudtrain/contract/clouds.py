"""The four cloud names, which provider serves each: the one place they are listed (stdlib only).

Both sides read it: the operator's parse-time checks and the agent on the instance (it ships in the
agent zip). ``clouds.registry`` maps a name to the provider's backend on the Airflow side.
"""

from __future__ import annotations

# The studio tool's names (see docs/design.md), mapped to the provider that serves them.
CLOUDS: dict[str, str] = {"ec2": "aws", "ec2spot": "aws", "gcloud": "gcp", "gcspot": "gcp"}
AWS_CLOUDS: frozenset[str] = frozenset(c for c, p in CLOUDS.items() if p == "aws")
GCP_CLOUDS: frozenset[str] = frozenset(c for c, p in CLOUDS.items() if p == "gcp")
SPOT_CLOUDS: frozenset[str] = frozenset({"ec2spot", "gcspot"})


def provider_of(cloud: str) -> str:
    """``aws`` or ``gcp`` for a cloud name; raises naming the accepted names otherwise."""
    try:
        return CLOUDS[cloud]
    except KeyError:
        raise ValueError(f"cloud={cloud!r} is not valid: use one of {', '.join(CLOUDS)}") from None


def conn_id_for(cloud: str, aws_conn_id: str | None, gcp_conn_id: str | None) -> str | None:
    """The connection of the provider that serves ``cloud``."""
    return gcp_conn_id if provider_of(cloud) == "gcp" else aws_conn_id


def location_for(cloud: str, region: str | None, zone: str | None) -> str | None:
    """Where instances are described and deleted: EC2 per region, GCE per zone."""
    return zone if provider_of(cloud) == "gcp" else region
