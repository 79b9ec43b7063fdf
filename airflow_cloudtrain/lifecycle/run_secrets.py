"""The operator's side of ``secret_env``: what goes into the spec, and the run's own cloud secrets.

Cloud references (SSM, Secrets Manager, Secret Manager) go into ``RunSpec.secret_env`` as they are: the
agent reads them with the instance's identity and the operator never sees the value. An
``airflow_conn://`` / ``airflow_var://`` reference is resolved here, at launch, registered with
Airflow's secrets masker (so the task log shows ``***`` even where the job prints it), and stored as
a short-lived secret of the run in the cloud's store (``clouds.aws.secrets`` / ``clouds.gcp.secrets``,
reached through the run's ``RunBackend``: ``secret_kind``, ``secret_name``, ``put_secret``) through the
resource ledger, write-ahead, under a name made from the run key; the spec holds that
secret's reference. Teardown deletes it with every other resource of the run, and a retry whose store
was lost finds it by name/label (``sweep_secrets`` adds its kind to the backend's tag sweep).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.secret_refs import AIRFLOW_CONN, SecretRef, parse_ref
from airflow_cloudtrain.core.retry import call_with_retry

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.ledger import ResourceLedger

TTL_MARGIN_S = 86400.0  # a run secret outlives max_runtime by a day, then expires by itself
FLEET_LIFETIME_S = 29 * 86400.0  # a fleet's (its workers read them while items are left): 30 days


def by_operator(refs: dict[str, str]) -> bool:
    """Does any reference need the operator (and so a secret of the run in the cloud)?"""
    return any((ref := parse_ref(text)) is not None and ref.by_operator for text in refs.values())


def holds_run_secrets(refs: dict[str, str]) -> bool:
    """Does a spec's ``secret_env`` name secrets this run made (``/cloudtrain/<digest>/`` in SSM,
    ``secrets/cloudtrain-<digest>-`` in Secret Manager)? A trigger only has the spec to go by."""
    return any("/cloudtrain/" in text or "/secrets/cloudtrain-" in text for text in refs.values())


def sweep_secrets(backend: RunBackend, refs: dict[str, str]) -> None:
    """With operator-made secrets, every teardown's tag sweep also looks for them (a lost store).

    ``refs``: the task's ``secret_env`` (before launch) or the spec's (where they are already the
    run's own secrets' references)."""
    if not refs or not (by_operator(refs) or holds_run_secrets(refs)):
        return
    kind = backend.secret_kind
    kinds = tuple(backend.sweep_kinds)
    if kind not in kinds:
        backend.sweep_kinds = (*kinds, kind)


def mask(value: str) -> None:
    """Airflow's secrets masker: the task log and the UI show ``***`` for ``value`` from now on."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDK layouts
        from airflow.sdk.execution_time.secrets_masker import mask_secret  # type: ignore[no-redef]
    mask_secret(value)


def resolve_airflow_ref(var: str, ref: SecretRef) -> str:
    """The value behind ``airflow_conn://`` / ``airflow_var://``; ValueError naming what is missing."""
    from airflow.sdk import Connection, Variable

    if ref.scheme == AIRFLOW_CONN:
        try:
            conn = Connection.get(ref.name)
        except Exception as err:
            raise ValueError(
                f"secret_env[{var!r}]: connection {ref.name!r} not found ({type(err).__name__})"
            ) from None
        if ref.field == "uri":
            value: Any = conn.get_uri()
        elif ref.field == "extra":
            value = conn.extra
        elif ref.field.startswith("extra."):
            value = (conn.extra_dejson or {}).get(ref.field.split(".", 1)[1])
        else:
            value = getattr(conn, ref.field, None)
        if value in (None, ""):
            raise ValueError(f"secret_env[{var!r}]: connection {ref.name!r} has no {ref.field}")
        return str(value)
    try:
        value = Variable.get(ref.name)
    except Exception as err:
        raise ValueError(
            f"secret_env[{var!r}]: variable {ref.name!r} not found ({type(err).__name__})"
        ) from None
    if value in (None, ""):
        raise ValueError(f"secret_env[{var!r}]: variable {ref.name!r} is empty")
    return str(value)


def spec_secret_env(
    refs: dict[str, str],
    ledger: ResourceLedger,
    backend: RunBackend,
    digest: str,
    log: logging.Logger,
    max_runtime_s: float | None = None,
) -> dict[str, str]:
    """The spec's ``secret_env``: cloud references kept, ``airflow_*`` ones resolved, masked and
    stored as the run's secrets (ledger first), replaced by those secrets' references."""
    out: dict[str, str] = {}
    for var, text in refs.items():
        ref = parse_ref(text)
        if ref is None or not ref.by_operator:
            out[var] = text
            continue
        value = resolve_airflow_ref(var, ref)
        mask(value)
        out[var] = _store(backend, ledger, digest, var, value, max_runtime_s)
        log.info("secret_env[%s]: %s stored as %s for this run (deleted at teardown)", var, text, out[var])
    return out


def _store(
    backend: RunBackend,
    ledger: ResourceLedger,
    digest: str,
    var: str,
    value: str,
    max_runtime_s: float | None,
) -> str:
    kind = backend.secret_kind
    name, location = backend.secret_name(digest, var)
    if not any(e.id == name for e in ledger.of_kind(kind)):  # its name is known: a sweep-free entry
        ledger.intend(kind, location, id=name, token=name)
    ttl = (max_runtime_s or 7 * 86400.0) + TTL_MARGIN_S  # expires by itself should no teardown come
    return str(call_with_retry(lambda: backend.put_secret(digest, var, value, ttl)))
