"""Airflow's Celery configuration with warm workers: ``[celery] celery_config_options =
airflow_cloudtrain.celery_config.CELERY_CONFIG`` (``cloudtrain up --production`` sets it).

It is Airflow's own ``DEFAULT_CELERY_CONFIG`` (the documented way to change it: a dict that extends
it), with ``worker_warmup`` added to Celery's ``imports``: a worker imports the provider's run
machinery and the cloud SDKs once, in its parent process, so the task processes forked from its pool
inherit them (``worker_warmup``'s docstring: the measured cost it saves). Importing this module is
cheap, and the scheduler, which reads it too, does not import the warm-up.
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

WARMUP_MODULE = "airflow_cloudtrain.worker_warmup"

CELERY_CONFIG: dict[str, Any] = {
    **DEFAULT_CELERY_CONFIG,
    "imports": (*DEFAULT_CELERY_CONFIG.get("imports", ()), WARMUP_MODULE),
}

PACKAGE = Path(__file__).resolve().parent
# what a task on an Airflow worker never runs: the instance's side, the local clouds, the command line,
# the UI plugin (the api-server's), the permission generator
NOT_ON_WORKERS = ("agent", "emulator", "ui", "permissions", "cli", "celery_config", "worker_warmup")

log = logging.getLogger(__name__)


def _worker_side_files() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        room = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if not room.startswith(NOT_ON_WORKERS):
            yield path


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_by(tree: ast.AST) -> Iterator[str]:
    """Absolute imports anywhere in a module; ``from pkg import name`` as ``pkg.name`` when that is a
    module (``from google.cloud import compute_v1``), else ``pkg``: tried in that order by ``warm``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def modules_to_warm() -> list[str]:
    """Our worker-side modules, then every third-party module they import (the standard library's are
    mostly loaded already, and cheap)."""
    ours, theirs = [], set()
    for path in _worker_side_files():
        ours.append(_module_of(path))
        for name in _imported_by(ast.parse(path.read_text(), str(path))):
            top = name.partition(".")[0]
            if top not in sys.stdlib_module_names and top != "airflow_cloudtrain":
                theirs.add(name)
    return ours + sorted(theirs)


def _import(name: str) -> bool:
    """``name`` as a module, or its package when ``name`` is ``package.attribute``."""
    for candidate in (name, name.rpartition(".")[0]):
        if not candidate:
            break
        try:
            importlib.import_module(candidate)
            return True
        except ImportError:
            continue
        except Exception:  # a module that fails on import fails the same way in the task: not here
            log.warning("cloudtrain warm-up: importing %s failed", candidate, exc_info=True)
            return False
    return False


def aws_services_called() -> list[str]:
    """The AWS services the Airflow side calls, as the generated permission documents name them (an
    IAM action's prefix is its botocore service here); not those that only come as a permission another
    call needs (``iam:PassRole`` for ``RunInstances``: no client is made for it)."""
    from airflow_cloudtrain.permissions import DATA
    from airflow_cloudtrain.permissions.actions import AWS_EXTRA

    side_only = {action for extra in AWS_EXTRA.values() for action in extra} - {
        f"{service}:{operation}" for service, operation in AWS_EXTRA
    }
    services = set()
    for path in DATA.glob("*.aws.airflow.json"):
        for statement in json.loads(path.read_text())["Statement"]:
            actions = statement["Action"]
            for action in [actions] if isinstance(actions, str) else actions:
                if action not in side_only:
                    services.add(action.partition(":")[0])
    return sorted(services)


def load_service_models(services: list[str]) -> int:
    """Build one throwaway client per service on this process's shared botocore loader
    (``storage.service_models``), so that its models (the API, its endpoint rules, the partitions) are
    parsed here once, and a forked task process's clients reuse them: EC2's alone is 4 MB of JSON,
    0.1-0.3 CPU-seconds per task process that builds an EC2 client. No call is made and no connection
    opened (the endpoint is never reached); the credentials are placeholders, never used. The
    services' paginators and waiters too. Returns how many entries the loader's cache holds."""
    import boto3
    from botocore.exceptions import DataNotFoundError

    from airflow_cloudtrain.storage import share_service_models

    session = share_service_models(
        boto3.session.Session(
            region_name="us-east-1", aws_access_key_id="warm-up", aws_secret_access_key="warm-up"
        )
    )
    loader = session._session.get_component("data_loader")  # the shared one share_service_models set
    for service in services:
        try:
            session.client(service, endpoint_url="http://127.0.0.1:9")
        except Exception:  # a service this botocore does not know: its task fails the same way, not here
            log.warning("cloudtrain warm-up: no botocore client for %s", service, exc_info=True)
            continue
        for extras in ("paginators-1", "waiters-2"):  # loaded on a client's first get_paginator/waiter
            try:
                loader.load_service_model(service, extras)
            except DataNotFoundError:  # the service has none
                continue
    return len(getattr(loader, "_cache", {}))


def warm() -> tuple[int, float]:
    """Import everything ``modules_to_warm`` names, and parse the AWS service models the Airflow side's
    clients use (``load_service_models``); (modules newly loaded, seconds taken)."""
    before, started = len(sys.modules), time.monotonic()
    for name in modules_to_warm():
        _import(name)
    load_service_models(aws_services_called())
    return len(sys.modules) - before, time.monotonic() - started
