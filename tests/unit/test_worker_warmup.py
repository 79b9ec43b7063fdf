"""Warm Celery workers (``airflow_cloudtrain.worker_warmup``, ``celery_config``): the parent imports
what a task would, starts no thread, and a task process forked from it builds its cloud clients."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from airflow_cloudtrain import celery_config as worker_warmup

# A Celery worker's parent: Airflow's Celery app imported, then the warm-up as Celery's loader imports
# it; then a fork, as the pool and ``supervise`` fork, whose child builds the clients a run builds.
WORKER = textwrap.dedent(
    """
    import json, os, sys, threading
    import airflow.providers.celery.executors.celery_executor_utils
    from celery import Celery
    from airflow_cloudtrain.celery_config import CELERY_CONFIG
    app = Celery(config_source=CELERY_CONFIG)
    app.loader.import_default_modules()  # what the worker's start does, in its parent process
    import gc
    warm = {
        "threads": threading.active_count(),
        "frozen": gc.get_freeze_count(),
        "loaded": sorted(m for m in ("boto3", "google.cloud.compute_v1", "google.cloud.storage",
            "airflow_cloudtrain.lifecycle.run.engine", "airflow_cloudtrain.clouds.gcp.gce",
            "airflow_cloudtrain.clouds.aws.backend", "airflow_cloudtrain.agent.worker",
            "airflow_cloudtrain.emulator") if m in sys.modules),
    }
    pid = os.fork()
    if pid == 0:
        import boto3
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import compute_v1
        from airflow_cloudtrain.storage import service_models, share_service_models
        files = service_models().file_loader
        parsed = []
        read = files._load_file
        def load(path, *args):  # a file read and parsed (None: no such file, looked for)
            data = read(path, *args)
            parsed.extend([path] if data is not None else [])
            return data
        files._load_file = load
        before = set(sys.modules)
        # as the hook builds them: a new session per task, on the process's shared models
        session = share_service_models(boto3.session.Session(region_name="us-east-1",
            aws_access_key_id="x", aws_secret_access_key="y"))
        for service in ("ec2", "s3", "sqs", "autoscaling"):
            client = session.client(service, endpoint_url="http://127.0.0.1:9")
        ec2 = session.client("ec2", endpoint_url="http://127.0.0.1:9")
        ec2.get_paginator("describe_instances"), ec2.get_waiter("instance_running")
        compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest")
        heavy = [m for m in set(sys.modules) - before if m.startswith(("google.cloud.", "boto3."))]
        os._exit(10 if heavy else 11 if parsed else 0)
    warm["child"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps(warm))
    """
)


def test_a_warm_worker_has_the_sdks_and_no_thread_and_its_forks_build_clients() -> None:
    done = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    warm = json.loads(done.stdout.strip().splitlines()[-1])
    # fork-safe: importing started no thread (a thread's locks would be copied held into the pool)
    assert warm["threads"] == 1, warm
    # what it imported is frozen: a collection in a fork does not copy the shared pages
    assert warm["frozen"] > 100_000, warm
    # the engines and both clouds' SDKs; not the instance's agent nor the emulator
    assert warm["loaded"] == [
        "airflow_cloudtrain.clouds.aws.backend",
        "airflow_cloudtrain.clouds.gcp.gce",
        "airflow_cloudtrain.lifecycle.run.engine",
        "boto3",
        "google.cloud.compute_v1",
        "google.cloud.storage",
    ], warm
    # a forked task process builds its AWS clients (a new session, as the hook makes one per task)
    # and a Compute Engine client without importing an SDK again (10) or parsing a botocore model (11)
    assert warm["child"] == 0, warm
    assert "cloudtrain warm-up:" in done.stderr


def test_the_celery_config_is_airflow_s_with_the_warm_up_added() -> None:
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    from airflow_cloudtrain.celery_config import CELERY_CONFIG, WARMUP_MODULE

    assert {k: v for k, v in CELERY_CONFIG.items() if k != "imports"} == {
        k: v for k, v in DEFAULT_CELERY_CONFIG.items() if k != "imports"
    }
    assert tuple(CELERY_CONFIG["imports"]) == (*DEFAULT_CELERY_CONFIG.get("imports", ()), WARMUP_MODULE)
    assert WARMUP_MODULE == "airflow_cloudtrain.worker_warmup"


def test_what_is_warmed_is_read_from_the_worker_side_source() -> None:
    names = worker_warmup.modules_to_warm()
    # lazily imported SDKs, found inside functions
    assert {"boto3", "google.cloud.compute_v1", "google.cloud.aiplatform_v1.JobServiceClient"} <= set(names)
    ours = [n for n in names if n.startswith("airflow_cloudtrain")]
    assert "airflow_cloudtrain.operators.cloud_train" in ours and "airflow_cloudtrain.hooks.aws" in ours
    # never the instance's side, the local clouds, the UI plugin or the command line
    assert not [
        n for n in ours if n.removeprefix("airflow_cloudtrain.").startswith(worker_warmup.NOT_ON_WORKERS)
    ], ours
