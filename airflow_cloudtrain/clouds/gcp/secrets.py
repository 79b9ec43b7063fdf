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
from typing import Any

from airflow_cloudtrain.contract.runs import TAG_MANAGED, TAG_RUN_KEY
from airflow_cloudtrain.contract.secret_refs import gcp_ref
from airflow_cloudtrain.core.ledger import Resource, ResourceKind, register_kind

KIND = "gcp_secret"
CALL_TIMEOUT_S = 60.0


def secret_id(digest: str, var: str) -> str:
    return f"cloudtrain-{digest}-{var}"


def _client(backend: Any) -> Any:
    from google.cloud.secretmanager_v1 import SecretManagerServiceClient

    return SecretManagerServiceClient(
        transport="rest", **backend.hook._client_kwargs("secretmanager_endpoint")
    )


def put_secret(backend: Any, digest: str, var: str, value: str, ttl_s: float | None) -> tuple[str, str]:
    """Store ``value`` as the newest version; returns (the secret's name, the reference the agent reads)."""
    from google.api_core.exceptions import Conflict

    client = _client(backend)
    parent = f"projects/{backend.hook.project}"
    name = f"{parent}/secrets/{secret_id(digest, var)}"
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
    return name, gcp_ref(name)


def _find(backend: Any, digest: str) -> list[Resource]:
    pages = _client(backend).list_secrets(
        request={"parent": f"projects/{backend.hook.project}", "filter": f"labels.{TAG_RUN_KEY}={digest}"},
        timeout=CALL_TIMEOUT_S,
    )
    return [Resource(KIND, s.name, None) for s in pages]


def _delete(backend: Any, resources: list[Resource]) -> None:
    from google.api_core.exceptions import NotFound

    client = _client(backend)
    for resource in resources:
        with contextlib.suppress(NotFound):
            client.delete_secret(name=resource.id, timeout=CALL_TIMEOUT_S)


GCP_SECRET = register_kind(ResourceKind(KIND, _find, _delete))
