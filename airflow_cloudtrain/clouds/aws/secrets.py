"""The run's own secrets on AWS: SSM SecureString parameters ``/cloudtrain/<run key digest>/<VAR>``.

What the operator resolved from Airflow (``airflow_conn://`` / ``airflow_var://``) lives here for the
run's lifetime: encrypted with the account's ``aws/ssm`` key, expiring by itself (an Expiration
policy: ``max_runtime`` plus a day) should no teardown reach it, readable by the instance profile, found
by name from the run key (``describe_parameters`` on the prefix) and deleted at teardown through the
ledger kind registered below, "not found" counting as done.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

from airflow_cloudtrain.contract.secret_refs import ssm_ref
from airflow_cloudtrain.core.inventory import Tagged, register_lister, timestamp
from airflow_cloudtrain.core.ledger import Resource, ResourceKind, register_kind

if TYPE_CHECKING:
    from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook


class SsmBackend(Protocol):
    """What these calls need of ``AwsRunBackend`` (the ledger hands its kinds the backend)."""

    hook: CloudTrainAwsHook
    region: str | None


KIND = "ssm_parameter"
# The calls of this module (``put_secret``, ``_find``, ``_delete``), as the emulator records them: the
# Airflow side of every operator that takes ``secret_env`` may make them (``permissions.secret_calls``)
CALLS = (("ssm", "PutParameter"), ("ssm", "DescribeParameters"), ("ssm", "DeleteParameters"))
DELETE_BATCH = 10  # DeleteParameters takes up to 10 names


def prefix(digest: str) -> str:
    return f"/cloudtrain/{digest}/"


def parameter_name(digest: str, var: str) -> str:
    return f"{prefix(digest)}{var}"


def _ssm(backend: SsmBackend, region: str | None = None) -> Any:
    return backend.hook.client("ssm", region=region or backend.region)


def put_secret(
    backend: SsmBackend,
    digest: str,
    var: str,
    value: str,
    ttl_s: float | None = None,
    description: str | None = None,
) -> tuple[str, str | None, str]:
    """Store ``value``; returns (parameter name, region, the reference the agent reads): the same
    signature as ``clouds.gcp.secrets.put_secret``.

    With ``ttl_s`` the parameter is an advanced one with an Expiration policy, so SSM deletes it by
    itself even if no teardown reaches it (advanced parameters cost $0.05 a month, prorated hourly)."""
    name = parameter_name(digest, var)
    region = str(backend.region)  # the backend's: the connection's region unless one was bound
    if description is None:
        description = f"cloudtrain: {var} of run {digest}, deleted at teardown"
    extra: dict[str, Any] = {}
    if ttl_s:
        at = datetime.now(timezone.utc) + timedelta(seconds=ttl_s)
        expiry = {
            "Type": "Expiration",
            "Version": "1.0",
            "Attributes": {"Timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.000Z")},
        }
        extra = {"Tier": "Advanced", "Policies": json.dumps([expiry])}
    _ssm(backend).put_parameter(
        Name=name, Value=value, Type="SecureString", Overwrite=True, Description=description[:1024], **extra
    )
    return name, region, ssm_ref(region, name)


def _find(backend: SsmBackend, digest: str) -> list[Resource]:
    pages = (
        _ssm(backend)
        .get_paginator("describe_parameters")
        .paginate(ParameterFilters=[{"Key": "Name", "Option": "BeginsWith", "Values": [prefix(digest)]}])
    )
    return [Resource(KIND, p["Name"], backend.region) for page in pages for p in page.get("Parameters", [])]


def _delete(backend: SsmBackend, resources: list[Resource]) -> None:
    by_region: dict[str | None, list[str]] = {}
    for resource in resources:
        by_region.setdefault(resource.location or backend.region, []).append(resource.id or "")
    for region, names in by_region.items():
        ssm = _ssm(backend, region)
        for start in range(0, len(names), DELETE_BATCH):  # missing names come back as InvalidParameters
            ssm.delete_parameters(Names=names[start : start + DELETE_BATCH])


SSM_PARAMETER = register_kind(ResourceKind(KIND, _find, _delete))


# --- cloudtrain gc: every run's parameters in the region ------------------------------------------


def _list_tagged(backend: SsmBackend) -> list[Tagged]:
    """Every parameter under ``/cloudtrain/``: the run key digest is the name's second part."""
    pages = (
        _ssm(backend)
        .get_paginator("describe_parameters")
        .paginate(ParameterFilters=[{"Key": "Name", "Option": "BeginsWith", "Values": ["/cloudtrain/"]}])
    )
    return [
        Tagged(
            KIND,
            str(p["Name"]),
            backend.region,
            str(p["Name"]).split("/")[2] or None,
            created_at=timestamp(p.get("LastModifiedDate")),
            state=str(p.get("Tier") or "Standard"),
        )
        for page in pages
        for p in page.get("Parameters", [])
        if len(str(p["Name"]).split("/")) >= 4
    ]


register_lister("aws", KIND, _list_tagged)
