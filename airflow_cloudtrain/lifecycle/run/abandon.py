"""Abandoning a run: its end will not be reported, so release everything and let no retry report it.

One function for both sides that give a run up: the worker (``RunAttempt.abandon``: a kill, a
timeout, a failed launch or wait, a failed deferral) and the triggerer (``RunTrigger.on_kill``: the
user killed the deferred task). Terminating an instance makes its agent write a final
``interrupted`` status; a retry must run the job again rather than report that, so every instance
of the run whose status is not final yet is marked as reported (the ``delivered`` marker) before it
is released. A job that did finish before this is still delivered by the retry.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.runs import SPEC_KEY, RunSpec, RunStatus, delivered_key, status_key
from airflow_cloudtrain.core.ledger import store_get, store_set
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.engine import Log
    from airflow_cloudtrain.core.ledger import Resource, ResourceLedger
    from airflow_cloudtrain.storage import RunFolder

DELIVERED_KEY = "cloudtrain_delivered"  # task_state_store: instances whose end was already reported
# How long the run-folder marks may be retried, in all, before going on without them: they are best
# effort (the task's store holds them too), and a release (``abandon_run``'s comes after them) or the
# task's end must not wait on a bucket that refuses writes (call_with_retry's default is 5 minutes)
MARK_BUDGET_S = 30.0


def has_final_status(folder: RunFolder, instance_id: str) -> bool:
    """Has the agent on ``instance_id`` written a final status to the run folder?"""
    raw = folder.get_text(status_key(instance_id))
    return bool(raw) and RunStatus.from_json(raw or "").final


def mark_reported(
    folder: RunFolder, instance_id: str, try_number: int, state: str, budget: TransientBudget | None = None
) -> None:
    """The ``delivered`` marker: this instance's end was reported to Airflow (or given up on by a
    teardown, ``state="released"``), so no retry reports it again."""
    note = json.dumps({"try_number": try_number, "state": state, "at": time.time()})
    call_with_retry(lambda: folder.put_text(delivered_key(instance_id), note), budget)


def mark_delivered(
    store: Any,
    folder: RunFolder,
    instance_id: str,
    try_number: int,
    state: str,
    log: Log,
    budget: TransientBudget | None = None,
) -> None:
    """Both in the task's store (when it has one) and in the run folder, so a retry never reports
    this end again; the store's copy stands when the bucket cannot be written (``MARK_BUDGET_S``)."""
    budget = budget or TransientBudget(budget_s=MARK_BUDGET_S)
    if store is not None:
        stored = store_get(store, DELIVERED_KEY) or {}
        store_set(store, DELIVERED_KEY, {"ids": [*stored.get("ids", []), instance_id][-50:]})
    try:
        mark_reported(folder, instance_id, try_number, state, budget)
    except Exception as err:
        log.warning("Could not mark the end of %s as reported in the run folder: %s", instance_id, err)


def delivered(store: Any, folder: RunFolder, instance_id: str) -> bool:
    """Was this instance's end already reported to Airflow (or given up on by a teardown)?"""
    stored = store_get(store, DELIVERED_KEY) or {}
    return instance_id in stored.get("ids", []) or bool(folder.get_text(delivered_key(instance_id)))


def abandon_run(
    backend: RunBackend,
    folder: RunFolder,
    ledger: ResourceLedger,
    log: Log,
    *,
    try_number: int,
    store: Any = None,
    mark_budget: TransientBudget | None = None,
    release_budget: TransientBudget | None = None,
) -> list[Resource]:
    """Release every resource of the run behind ``ledger``, its unfinished instances marked first.

    The run's instances are found by tag as well (an instance whose create call never returned),
    and the secrets the operator stored for it (its spec's ``secret_env``) are swept with it. The
    marks are best effort: releasing matters more. Returns what was released."""
    sweep = bool(ledger.run_key)  # a launch recorded without its run key: only what the ledger holds
    mark_budget = mark_budget or TransientBudget(budget_s=MARK_BUDGET_S)  # for all the marks at once
    _sweep_run_secrets_too(backend, folder, log)
    try:
        if sweep:  # every instance of the run, to mark (the release sweeps every kind again)
            ledger.sweep(backend, ["instance"])
        for entry in ledger.of_kind("instance"):
            if not has_final_status(folder, entry.id or ""):
                mark_delivered(store, folder, entry.id or "", try_number, "released", log, mark_budget)
    except Exception as err:  # the release below matters more
        log.warning("Could not mark the run's instances before releasing them: %s", err)
    budget = release_budget or TransientBudget(budget_s=120.0)
    return call_with_retry(lambda: ledger.release(backend, sweep=sweep), budget)


def _sweep_run_secrets_too(backend: RunBackend, folder: RunFolder, log: Log) -> None:
    """Secrets the operator stored for the run (``secret_env``'s airflow_* references) go with it:
    the spec names them, so the release's sweep looks for their kind too; so does a gang's
    (``num_nodes`` > 1) network and placement (the backend's ``gang_kinds``)."""
    from airflow_cloudtrain.lifecycle.run_secrets import sweep_secrets

    try:
        raw = folder.get_bytes(SPEC_KEY)
        spec = RunSpec.from_json(raw.decode()) if raw else None
    except Exception as err:  # releasing the instance matters more
        log.warning("Could not read the run's spec for its secrets: %s", err)
        return
    if spec is not None:
        sweep_secrets(backend, spec.secret_env)
    if spec is not None and spec.num_nodes > 1:  # a gang's network and placement go with it too
        kinds = tuple(backend.sweep_kinds)
        extra = [k for k in getattr(backend, "gang_kinds", ()) if k not in kinds]
        backend.sweep_kinds = (*kinds, *extra)
