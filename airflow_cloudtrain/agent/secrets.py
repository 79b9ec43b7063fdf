"""The agent reads the run's secrets (``RunSpec.secret_env``) with the instance's own identity.

Each value of ``secret_env`` is a cloud reference (``agent.secret_refs``): SSM parameters and Secrets
Manager secrets through boto3 with the instance profile's credentials (no region in the reference:
the instance's region), GCP Secret Manager versions over REST (``:access``) with the VM's service
account. The values go into the job's environment only, never into a file, the spec or a status;
``redactions`` of them are cut out of every log chunk the agent uploads (``LogStreamer``).

``CLOUDTRAIN_SECRETMANAGER_ENDPOINT`` (set by the emulator for its VMs, unset in production) sends
the Secret Manager calls to another endpoint, with no credentials.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from typing import Any

from airflow_cloudtrain.contract.retry import retry
from airflow_cloudtrain.contract.secret_refs import (
    AWS_SECRETSMANAGER,
    AWS_SSM,
    GCP_SECRET,
    SecretRef,
    parse_ref,
)

SECRETMANAGER_ENDPOINT_ENV = "CLOUDTRAIN_SECRETMANAGER_ENDPOINT"
SECRETMANAGER_URL = "https://secretmanager.googleapis.com"
# The one call ``_read`` makes for each scheme, as the emulators record calls (provider, service,
# operation): the permission documents grant them to the instances of every operator that takes
# ``secret_env`` (``permissions.secret_calls``), whether or not a recorded run read that scheme.
READS: dict[str, tuple[str, str, str]] = {
    AWS_SSM: ("aws", "ssm", "GetParameter"),
    AWS_SECRETSMANAGER: ("aws", "secretsmanager", "GetSecretValue"),
    GCP_SECRET: ("gcp", "secretmanager", "versions.access"),
}


class SecretUnavailable(RuntimeError):
    """A secret the job needs could not be read (the message names the variable and the reference,
    never a value)."""


class HttpError(RuntimeError):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"HTTP {code}: {text[:300]}")
        self.code = code


def resolve_secret_env(refs: dict[str, str]) -> dict[str, str]:
    """``{VAR: value}`` for the spec's ``{VAR: reference}``; raises SecretUnavailable on the first
    reference that cannot be read."""
    clients: dict[tuple[str, str], Any] = {}
    values: dict[str, str] = {}
    for var, text in refs.items():
        ref = parse_ref(text)
        if ref is None or ref.cloud is None:
            raise SecretUnavailable(f"secret_env[{var!r}]: {text!r} is not a cloud secret reference")
        try:
            values[var] = retry(functools.partial(_read, ref, clients), budget_s=60.0, what=f"reading {var}")
        except SecretUnavailable:
            raise
        except Exception as err:
            raise SecretUnavailable(
                f"secret_env[{var!r}]: could not read {text!r} with this instance's identity: "
                f"{type(err).__name__}: {err}"
            ) from None
    return values


def _read(ref: SecretRef, clients: dict[tuple[str, str], Any]) -> str:
    if ref.scheme == AWS_SSM:
        ssm = _boto(clients, "ssm", ref.region)
        # by its ARN when given: a parameter shared from another account has no name in this one
        name = ref.arn or ref.name
        return str(ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"])
    if ref.scheme == AWS_SECRETSMANAGER:
        answer = _boto(clients, "secretsmanager", ref.region).get_secret_value(SecretId=ref.name)
        text = answer.get("SecretString")
        if text is None:
            text = base64.b64decode(answer.get("SecretBinary") or b"").decode("utf-8")
        return _pick(text, ref)
    if ref.scheme == GCP_SECRET:
        return _gcp_access(ref.name, clients)
    raise SecretUnavailable(f"unknown secret scheme {ref.scheme!r}")


def _pick(text: str, ref: SecretRef) -> str:
    """The whole secret, or its JSON key ``ref.field``."""
    if not ref.field:
        return text
    try:
        data = json.loads(text)
    except ValueError:
        raise SecretUnavailable(
            f"{ref.name}: #{ref.field} asks for a JSON key, the secret is not JSON"
        ) from None
    if not isinstance(data, dict) or ref.field not in data:
        raise SecretUnavailable(f"{ref.name}: the secret's JSON has no key {ref.field!r}")
    return str(data[ref.field])


def _boto(clients: dict[tuple[str, str], Any], service: str, region: str) -> Any:
    key = (service, region)
    if key not in clients:
        from botocore.config import Config

        from airflow_cloudtrain.storage import aws_client

        config = Config(retries={"mode": "standard", "max_attempts": 5})
        clients[key] = aws_client(service, region_name=region or None, config=config)
    return clients[key]


def _gcp_access(version_name: str, clients: dict[tuple[str, str], Any]) -> str:
    if ("gcp", "") not in clients:
        from airflow_cloudtrain.agent.google_rest import google_session

        clients[("gcp", "")] = google_session(os.environ.get(SECRETMANAGER_ENDPOINT_ENV), SECRETMANAGER_URL)
    session, base = clients[("gcp", "")]
    response = session.get(f"{base}/v1/{version_name}:access", timeout=30)
    if response.status_code != 200:
        raise HttpError(response.status_code, response.text)
    data = response.json().get("payload", {}).get("data", "")
    return base64.b64decode(data).decode("utf-8")
