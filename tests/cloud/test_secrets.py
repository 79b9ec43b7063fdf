"""``secret_env`` on both emulated clouds, inside real Airflow: the job gets its secrets, nobody else does.

Three secrets are planted: one in the cloud's own store (SSM SecureString / Secret Manager), read by
the agent with the instance's identity, and an Airflow variable and connection password, which the
operator stores as secrets of the run. The job prints them (and a hash of them, so the test can tell
it saw the right values): the task log shows ``***``, and no planted value is in any object of the
run's bucket prefix, in the user data or in the XCom. The run's own secrets are gone after success,
after a failure, and after a worker killed right after creating them and the retry that follows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import textwrap
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from dag_helpers import start_first_try, task_states, write_dag, xcom

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.storage import open_run_folder

CLOUD = {"aws": "ec2", "gcp": "gcloud"}
REGION = {"aws": "us-east-1", "gcp": "us-central1"}
BUCKET = {"aws": "s3://cloudtrain-emulated/secrets", "gcp": "gs://cloudtrain-emulated/secrets"}
PROJECT = "cloudtrain-emulated"
JOB = (
    'echo "token=$API_TOKEN var=$HF_TOKEN conn=$DB_PASSWORD"; '
    "python3 -c \"import os, hashlib; print('digest', hashlib.sha256('|'.join(os.environ[k] for k in "
    "('API_TOKEN', 'HF_TOKEN', 'DB_PASSWORD')).encode()).hexdigest())\""
)

DYING = """
import os
import signal

from airflow_cloudtrain.core.ledger import ResourceLedger


class DyingLedger(ResourceLedger):
    def intend(self, kind, *args, **kwargs):
        if kind == "instance" and os.environ.get("CLOUDTRAIN_TEST_DIE_AT") == "instance":
            os.kill(os.getpid(), signal.SIGKILL)  # the run's secrets exist; no teardown code runs
        return super().intend(kind, *args, **kwargs)


class Op(CloudTrainOperator):
    def _new_attempt(self, context):
        attempt = super()._new_attempt(context)
        attempt.ledger.__class__ = DyingLedger
        return attempt
"""


@pytest.fixture
def planted(emu: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fresh secret values: in each cloud's store, an Airflow variable and a connection password."""
    values = {k: f"{k.lower()}-{uuid.uuid4().hex}" for k in ("cloud", "var", "conn")}
    monkeypatch.setenv("AIRFLOW_VAR_HF_TOKEN", values["var"])
    monkeypatch.setenv(
        "AIRFLOW_CONN_TRAINING_DB",
        json.dumps({"conn_type": "postgres", "login": "trainer", "password": values["conn"], "host": "db"}),
    )
    import boto3

    boto3.client("ssm").put_parameter(
        Name="/team/api-token", Value=values["cloud"], Type="SecureString", Overwrite=True
    )
    client = secret_manager(emu)
    from google.api_core.exceptions import Conflict

    with contextlib.suppress(Conflict):  # made by an earlier test: a new version is the value
        client.create_secret(
            parent=f"projects/{PROJECT}", secret_id="api-token", secret={"replication": {"automatic": {}}}
        )
    client.add_secret_version(
        parent=f"projects/{PROJECT}/secrets/api-token", payload={"data": values["cloud"].encode()}
    )
    return values


def secret_manager(emu: Any) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.secretmanager_v1 import SecretManagerServiceClient

    return SecretManagerServiceClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": emu.secretmanager_endpoint},
    )


def dag_source(
    dag_id: str,
    provider: str,
    command: str,
    operator: str = "CloudTrainOperator",
    deferrable: bool = False,
    secrets: dict[str, str] | None = None,
) -> str:
    ref = (
        "aws-ssm:///team/api-token"
        if provider == "aws"
        else f"gcp-secret://projects/{PROJECT}/secrets/api-token"
    )
    secrets = secrets or {
        "API_TOKEN": ref,
        "HF_TOKEN": "airflow_var://hf_token",
        "DB_PASSWORD": "airflow_conn://training_db/password",
    }
    body = textwrap.dedent(
        f"""
        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            {operator}(task_id="train", cloud={CLOUD[provider]!r}, cpus=2, ram="4g", command={command!r},
                       bucket={BUCKET[provider]!r}, region={REGION[provider]!r}, poll_interval=0.5,
                       live_prices=False, env={{"PLAIN": "1"}}, deferrable={deferrable},
                       secret_env={secrets!r})
        """
    )
    header = "from datetime import datetime\nfrom airflow.sdk import DAG\n"
    header += "from airflow_cloudtrain.operators import CloudTrainOperator\n"
    return header + (DYING if operator != "CloudTrainOperator" else "") + body


def digest_of(provider: str, dag_id: str, run_id: str) -> str:
    return RunKey(dag_id, "train", run_id, -1, BUCKET[provider]).digest


def run_secrets(emu: Any, provider: str, digest: str) -> list[str]:
    """The run's own secrets that exist now, asked through the real clients."""
    if provider == "aws":
        import boto3

        found = boto3.client("ssm").describe_parameters(
            ParameterFilters=[{"Key": "Name", "Option": "BeginsWith", "Values": [f"/cloudtrain/{digest}/"]}]
        )
        return [p["Name"] for p in found["Parameters"]]
    pages = secret_manager(emu).list_secrets(
        request={"parent": f"projects/{PROJECT}", "filter": f"labels.cloudtrain-run-key={digest}"}
    )
    return [s.name for s in pages]


def expiring(emu: Any, provider: str, digest: str) -> int:
    """How many of the run's own secrets carry an expiry (SSM Expiration policy / Secret Manager TTL)."""
    if provider == "aws":
        import boto3

        found = boto3.client("ssm").describe_parameters(
            ParameterFilters=[{"Key": "Name", "Option": "BeginsWith", "Values": [f"/cloudtrain/{digest}/"]}]
        )["Parameters"]
        return sum("Expiration" in str(p.get("Policies")) for p in found)
    pages = secret_manager(emu).list_secrets(
        request={"parent": f"projects/{PROJECT}", "filter": f"labels.cloudtrain-run-key={digest}"}
    )
    return sum("expire_time" in s for s in pages)


def bucket_objects(provider: str) -> dict[str, bytes]:
    """Every object under the tests' bucket prefix: run folders, and the bucket's live index."""
    scheme = "s3" if provider == "aws" else "gs"
    folder = open_run_folder(f"{scheme}://cloudtrain-emulated")
    keys = folder.list("secrets/") + folder.list("_cloudtrain/")
    return {key: folder.get_bytes(key) or b"" for key in keys}


def user_data_watch(emu: Any, provider: str, mark: Any) -> tuple[threading.Thread, dict[str, str]]:
    """Reads the instance's user data / startup script while it runs (GCE deletes the VM at teardown),
    then creates ``mark``, which the job waits for (not a fixed sleep: the VM is still there to read)."""
    seen: dict[str, str] = {}

    def watch() -> None:
        deadline = time.monotonic() + 500  # a loaded machine: parsing, launch and agent start first
        while time.monotonic() < deadline and not seen:
            for inst in emu.running_instances():
                if provider == "gcp":
                    meta = next((i["metadata"] for i in emu.gce.alive() if i["name"] == inst["id"]), None)
                    if meta:
                        seen["user_data"] = meta.get("startup-script", "")
                else:
                    import base64

                    import boto3

                    raw = boto3.client("ec2").describe_instance_attribute(
                        InstanceId=inst["id"], Attribute="userData"
                    )
                    seen["user_data"] = base64.b64decode(raw["UserData"]["Value"]).decode()
            time.sleep(0.2)
        mark.touch()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


@pytest.mark.parametrize(
    ("provider", "deferrable"),
    [("aws", False), ("gcp", False), ("aws", True)],
    ids=["aws", "gcp", "aws-deferred"],
)
def test_the_job_gets_its_secrets_and_nothing_else_does(
    emu, airflow_db, capfd, tmp_path, planted: dict[str, str], provider: str, deferrable: bool
) -> None:
    """Deferred, the job's lines reach the task log through the trigger (the live index's tail)."""
    dag_id = f"secrets_ok_{provider}_{int(deferrable)}"
    mark = tmp_path / "user-data-read"
    watcher, seen = user_data_watch(emu, provider, mark)
    held = f"for i in $(seq 1 2400); do [ -e '{mark}' ] && break; sleep 0.1; done; {JOB}"
    run = write_dag(dag_source(dag_id, provider, held, deferrable=deferrable), dag_id).test()
    watcher.join(250)
    log = capfd.readouterr().out
    assert task_states(run) == {"train": "success"}, log[-3000:]
    expected = hashlib.sha256(
        "|".join([planted["cloud"], planted["var"], planted["conn"]]).encode()
    ).hexdigest()
    assert f"digest {expected}" in log  # the job saw the right three values
    assert "token=*** var=*** conn=***" in log  # and printing them shows only the mask
    result = xcom(run, "train")
    spec = json.loads(open_run_folder(result["run_uri"]).get_text("spec.json"))
    digest = digest_of(provider, dag_id, run.run_id)
    own = (
        f"aws-ssm://us-east-1/cloudtrain/{digest}/"
        if provider == "aws"
        else f"gcp-secret://projects/{PROJECT}/secrets/cloudtrain-{digest}-"
    )
    assert spec["secret_env"][
        "API_TOKEN"
    ] == (  # references only: the cloud's as given, ours in place of Airflow's
        "aws-ssm:///team/api-token"
        if provider == "aws"
        else f"gcp-secret://projects/{PROJECT}/secrets/api-token"
    )
    assert spec["secret_env"]["HF_TOKEN"].startswith(own) and spec["secret_env"]["DB_PASSWORD"].startswith(
        own
    )
    places = {
        "XCom": json.dumps(result).encode(),
        "task log": log.encode(),
        "user data": seen["user_data"].encode(),
    }
    places.update(bucket_objects(provider))
    assert any(key.endswith(".log") for key in places)  # the job's log chunks were searched too
    for value in planted.values():
        leaked = [where for where, data in places.items() if value.encode() in data]
        assert leaked == [], f"{value} found in {leaked}"
    assert run_secrets(emu, provider, digest) == []


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_a_failed_job_leaves_no_secret(
    emu, airflow_db, capfd, planted: dict[str, str], provider: str
) -> None:
    dag_id = f"secrets_fail_{provider}"
    run = write_dag(dag_source(dag_id, provider, 'echo "token=$HF_TOKEN"; exit 3'), dag_id).test()
    log = capfd.readouterr().out
    assert task_states(run) == {"train": "failed"}
    assert "token=***" in log and planted["var"] not in log
    assert run_secrets(emu, provider, digest_of(provider, dag_id, run.run_id)) == []


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_a_worker_killed_after_making_the_secrets_leaves_none_after_the_retry(
    emu, airflow_db, capfd, planted: dict[str, str], provider: str
) -> None:
    from airflow.models import DagRun
    from dag_helpers import load_example

    dag_id = f"secrets_killed_{provider}"
    write_dag(dag_source(dag_id, provider, JOB, operator="Op"), dag_id)
    when = datetime(2026, 3, 1, tzinfo=timezone.utc)
    proc = start_first_try(dag_id, when, {"CLOUDTRAIN_TEST_DIE_AT": "instance"})
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == -9, f"try 1 did not die: rc={proc.returncode}\n{err[-3000:]}"
    (first,) = DagRun.find(dag_id=dag_id)
    digest = digest_of(provider, dag_id, first.run_id)
    assert len(run_secrets(emu, provider, digest)) == 2  # killed halfway: the run's secrets exist
    assert expiring(emu, provider, digest) == 2  # and each expires by itself should nothing come back
    assert emu.running_instances() == []  # and no instance yet

    run = load_example(dag_id).test(logical_date=when, run_after=when)
    assert task_states(run) == {"train": "success"}, capfd.readouterr().out[-3000:]
    assert run_secrets(emu, provider, digest) == []


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_a_fleet_worker_gets_the_secrets_and_the_fleet_leaves_none(
    emu, airflow_db, capfd, planted: dict[str, str], provider: str
) -> None:
    """SpotFleetOperator / PreemptibleGroupOperator: every item's job reads the same secrets; the run's
    own are gone after it, with the rest of the fleet."""
    from dag_helpers import fleet_nothing_left, gce_fleet_nothing_left

    dag_id = f"secrets_fleet_{provider}"
    if provider == "aws":
        operator, args = "SpotFleetOperator", 'cloud="ec2spot", region="us-east-1"'
        ref = "aws-ssm:///team/api-token"
    else:
        operator, args = "PreemptibleGroupOperator", 'region="us-central1"'
        ref = f"gcp-secret://projects/{PROJECT}/secrets/api-token"
    secrets = {
        "API_TOKEN": ref,
        "HF_TOKEN": "airflow_var://hf_token",
        "DB_PASSWORD": "airflow_conn://training_db/password",
    }
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import {operator}

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            {operator}(
                task_id="train", {args}, cpus=2, ram="4g", command={JOB!r}, bucket={BUCKET[provider]!r},
                work_items=["a", "b"], poll_interval=0.5, live_prices=False, lease_timeout=10,
                secret_env={secrets!r})
        """
    )
    run = write_dag(source, dag_id).test()
    log = capfd.readouterr().out
    assert task_states(run) == {"train": "success"}, log[-3000:]
    expected = hashlib.sha256(
        "|".join([planted["cloud"], planted["var"], planted["conn"]]).encode()
    ).hexdigest()
    objects = bucket_objects(provider)
    item_logs = b"".join(data for key, data in objects.items() if dag_id in key and key.endswith(".log"))
    assert item_logs.count(f"digest {expected}".encode()) == 2  # each item's job saw the right values
    assert b"token=*** var=*** conn=***" in item_logs
    for value in planted.values():
        assert value not in log and value not in json.dumps(xcom(run, "train"))
        assert [key for key, data in objects.items() if value.encode() in data] == []
    digest = digest_of(provider, dag_id, run.run_id)
    assert run_secrets(emu, provider, digest) == []
    if provider == "aws":
        fleet_nothing_left(digest)
    else:
        gce_fleet_nothing_left(emu, digest)


def test_a_secret_the_instance_cannot_read_fails_the_run_naming_it(emu, airflow_db, capfd) -> None:
    dag_id = "secrets_missing_aws"
    source = dag_source(
        dag_id, "aws", "echo ran-$((40+2))", secrets={"API_TOKEN": "aws-ssm:///team/no-such-token"}
    )
    run = write_dag(source, dag_id).test()
    log = capfd.readouterr().out
    assert task_states(run) == {"train": "failed"}
    assert "secret_env['API_TOKEN']: could not read 'aws-ssm:///team/no-such-token'" in log
    assert "ParameterNotFound" in log and "ran-42" not in log  # the job never started


def test_a_deferred_task_killed_releases_the_run_s_secrets_with_its_instance(emu, capfd) -> None:
    """``RunTrigger.on_kill`` has only the launch record and the spec: the spec's references name the
    run's own SSM parameter, so the release sweeps that kind too, not just the instance."""
    import asyncio

    import boto3

    from airflow_cloudtrain.clouds.registry import backend_for
    from airflow_cloudtrain.contract.runs import SPEC_KEY, RunSpec
    from airflow_cloudtrain.core.records import LaunchRecord
    from airflow_cloudtrain.triggers.run import RunTrigger

    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    iid = ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    digest = uuid.uuid4().hex[:20]
    backend = backend_for("ec2", region="us-east-1", aws_conn_id="aws_default")
    ref = backend.put_secret(digest, "HF_TOKEN", f"v-{uuid.uuid4().hex}", None)
    run_uri = f"{BUCKET['aws']}/killed-{digest}"
    spec = RunSpec(run_id="ct-x", run_uri=run_uri, cloud="ec2", command="true", secret_env={"HF_TOKEN": ref})
    open_run_folder(run_uri).put_text(SPEC_KEY, spec.to_json())
    assert len(run_secrets(emu, "aws", digest)) == 1
    launch = LaunchRecord(
        run_id="ct-x",
        run_uri=run_uri,
        cloud="ec2",
        region="us-east-1",
        instance_id=iid,
        run_key=digest,
        location="us-east-1",
    )
    asyncio.run(RunTrigger(launch=launch.to_dict(), conn_id="aws_default").on_kill())
    state = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state == "terminated"
    assert run_secrets(emu, "aws", digest) == []


def test_the_agent_reads_each_scheme_with_the_one_call_the_documents_grant(
    emu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agent.secrets.READS`` is what the permission documents grant every ``secret_env`` operator's
    instances (``permissions.secret_calls``): the agent's reader, run against the emulated clouds for
    each scheme, makes those calls and no other. No instance: the reader in this process. The SSM
    reference is the ARN of a plain (no "/") name, which AWS writes as ``parameter/<name>``."""
    import boto3

    from airflow_cloudtrain.agent.secrets import READS, SECRETMANAGER_ENDPOINT_ENV, resolve_secret_env
    from airflow_cloudtrain.emulator import calls

    value = uuid.uuid4().hex
    boto3.client("ssm", region_name="us-east-1").put_parameter(
        Name="plain-token", Value=value, Type="SecureString", Overwrite=True
    )
    sm = boto3.client("secretsmanager", region_name="us-east-1")
    with contextlib.suppress(sm.exceptions.ResourceExistsException):
        sm.create_secret(Name="prod/reads-db", SecretString="{}")
    sm.put_secret_value(SecretId="prod/reads-db", SecretString=json.dumps({"password": value}))
    client = secret_manager(emu)
    from google.api_core.exceptions import Conflict

    with contextlib.suppress(Conflict):
        client.create_secret(
            parent=f"projects/{PROJECT}", secret_id="reads-token", secret={"replication": {"automatic": {}}}
        )
    client.add_secret_version(
        parent=f"projects/{PROJECT}/secrets/reads-token", payload={"data": value.encode()}
    )
    monkeypatch.setenv(SECRETMANAGER_ENDPOINT_ENV, emu.secretmanager_endpoint)
    calls.take()  # the planting's calls are not the reader's
    got = resolve_secret_env(
        {
            "SSM": "arn:aws:ssm:us-east-1:123456789012:parameter/plain-token",
            "SM": "aws-secretsmanager://us-east-1/prod/reads-db#password",
            "GCP": f"gcp-secret://projects/{PROJECT}/secrets/reads-token",
        }
    )
    assert got == {"SSM": value, "SM": value, "GCP": value}
    stores = {"ssm", "secretsmanager", "secretmanager"}
    made = {(c.provider, c.service, c.operation) for c in calls.take() if c.service in stores}
    assert made == set(READS.values())
