"""Warm Celery workers: the provider's run machinery and the cloud SDKs it imports lazily, imported
once in the worker's parent process, before it forks its pool.

Airflow's Celery worker forks a pool child per slot, and each task instance runs in a process forked
from one of them (``supervise``). Our operators import boto3 and the Google clients inside functions
(DAG parsing stays cheap), so every task process paid those imports again: profiled in
``cloudtrain up --production``, imports were three quarters of a task process's CPU, and
``google.cloud.compute_v1`` alone (about 1.9 CPU-seconds) more than a third; a deferred run executes
twice (start, then ``execute_complete``). Imported here once per worker, the forks inherit them.

``celery_config.CELERY_CONFIG`` names this module in Celery's ``imports``, which the worker imports at
its start in the parent process, before the pool starts (``celery.loaders.base.init_worker``); the
scheduler, which also reads the Celery config, never imports it. Nothing here starts a thread or opens
a connection (both would be unsafe to fork): it only imports. It costs the worker's parent about 230
MB (126 to 358 MB RSS, measured), shared copy-on-write with its pool; ``gc.freeze()`` afterwards keeps
the collector from touching (and so copying) those pages in the forks.

What is imported is read from our own source, not a hand list (``celery_config.modules_to_warm``):
every module of the Airflow side of the package (not the agent, the emulator, the UI or the command
line) and every third-party module they import, at the top or inside a function. Then the botocore
models of the AWS services the Airflow side calls (named by the generated permission documents) are
parsed into the process's shared loader (``celery_config.load_service_models``), so a task's clients
do not parse them again.
"""

from __future__ import annotations

import gc
import sys

from airflow_cloudtrain.celery_config import warm

loaded, took = warm()
# What was imported stays for the worker's life: out of the collector's sight (a permanent generation),
# a collection in a forked child does not touch, and so copy, the pages the forks share with us.
gc.freeze()
# the worker's logging is not set up yet at this point of its start: its output is where this goes
print(f"cloudtrain warm-up: {loaded} modules imported in {took:.1f} s before the pool forks", file=sys.stderr)
