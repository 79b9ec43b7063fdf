"""The run's own secrets on GCP: Secret Manager secrets ``cloudtrain-<run key digest>-<VAR>``.

What the operator resolved from Airflow (``airflow_conn://`` / ``airflow_var://``) lives here for the
run's lifetime: labelled with the run key, with a ``ttl`` (the run's ``max_runtime`` plus a day) so
that even a secret no teardown reached expires on its own, readable by the VM's service account,
found by label and deleted at teardown through the ledger kind registered below ("not found" is done).
The client is ``secretmanager_v1`` over REST, from the connection (extra ``secretmanager_endpoint``
points it elsewhere, as the emulator does).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol

from airflow_cloudtrain.contract.runs import TAG_MANAGED, TAG_RUN_KEY
from airflow_cloudtrain.contract.secret_refs import gcp_ref
from airflow_cloudtrain.core.inventory import Tagged, register_lister, timestamp
from airflow_cloudtrain.core.ledger import Resource, ResourceKind, register_kind

if TYPE_CHECKING:
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook


class SecretManagerBackend(Protocol):
    """What these calls need of ``GcpRunBackend`` (the ledger hands its kinds the backend)."""

    hook: CloudTrainGcpHook


KIND = "gcp_secret"
# The calls of this module (``put_secret``, ``_find``, ``_delete``), as the emulator records them: the
# Airflow side of every operator that takes ``secret_env`` may make them (``permissions.secret_calls``)
CALLS = (
    ("secretmanager", "secrets.create"),
    ("secretmanager", "secrets.addVersion"),
    ("secretmanager", "secrets.list"),
    ("secretmanager", "secrets.delete"),
)
CALL_TIMEOUT_S = 60.0


ID_PREFIX = "cloudtrain-"  # every run's secrets: the IAM condition of ``cloudtrain permissions --secret``


def secret_id(digest: str, var: str) -> str:
    return f"{ID_PREFIX}{digest}-{var}"


def secret_name(backend: SecretManagerBackend, digest: str, var: str) -> str:
    """The secret's full name in the connection's project (known before it exists)."""
    return f"projects/{backend.hook.project}/secrets/{secret_id(digest, var)}"


def _client(backend: SecretManagerBackend) -> Any:
    from google.cloud.secretmanager_v1 import SecretManagerServiceClient

    return SecretManagerServiceClient(
        transport="rest", **backend.hook._client_kwargs("secretmanager_endpoint")
    )


def put_secret(
    backend: SecretManagerBackend,
    digest: str,
    var: str,
    value: str,
    ttl_s: float | None = None,
    description: str | None = None,
) -> tuple[str, str | None, str]:
    """Store ``value`` as the newest version; returns (the secret's name, None: secrets have no
    location, the reference the agent reads): the signature of ``clouds.aws.secrets.put_secret``.
    ``description`` is not stored (labels carry the run key)."""
    from google.api_core.exceptions import Conflict

    client = _client(backend)
    parent = f"projects/{backend.hook.project}"
    name = secret_name(backend, digest, var)
    secret: dict[str, Any] = {
        "replication": {"automatic": {}},
        "labels": {TAG_RUN_KEY: digest, TAG_MANAGED: "true"},
    }
    if ttl_s:
        secret["ttl"] = {"seconds": int(ttl_s)}
    with contextlib.suppress(Conflict):  # an earlier try or launch made it: a new version it is
        client.create_secret(
            parent=parent, secret_id=secret_id(digest, var), secret=secret, timeout=CALL_TIMEOUT_S
        )
    client.add_secret_version(parent=name, payload={"data": value.encode("utf-8")}, timeout=CALL_TIMEOUT_S)
    return name, None, gcp_ref(name)


def _find(backend: SecretManagerBackend, digest: str) -> list[Resource]:
    pages = _client(backend).list_secrets(
        request={"parent": f"projects/{backend.hook.project}", "filter": f"labels.{TAG_RUN_KEY}={digest}"},
        timeout=CALL_TIMEOUT_S,
    )
    return [Resource(KIND, s.name, None) for s in pages]


def _delete(backend: SecretManagerBackend, resources: list[Resource]) -> None:
    from google.api_core.exceptions import NotFound

    client = _client(backend)
    for resource in resources:
        with contextlib.suppress(NotFound):
            client.delete_secret(name=resource.id, timeout=CALL_TIMEOUT_S)


GCP_SECRET = register_kind(ResourceKind(KIND, _find, _delete))


# --- cloudtrain gc: every run's secrets in the project --------------------------------------------


def _list_tagged(backend: SecretManagerBackend) -> list[Tagged]:
    """Every secret labelled with a run key (one list call, filtered here: any label value)."""
    pages = _client(backend).list_secrets(
        request={"parent": f"projects/{backend.hook.project}"}, timeout=CALL_TIMEOUT_S
    )
    return [
        Tagged(KIND, str(s.name), None, digest, created_at=timestamp(s.create_time), state="secret")
        for s in pages
        if (digest := dict(s.labels).get(TAG_RUN_KEY))
    ]


register_lister("gcp", KIND, _list_tagged)
