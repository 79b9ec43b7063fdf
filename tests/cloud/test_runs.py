"""CloudTrainOperator on the emulated EC2 and GCE, inside real Airflow: every way a run can end.

Each scenario runs on both clouds and checks what a user would: the task's state, the run folder's
status, and that every instance the run launched is gone (the ``emu`` fixture also fails any test
that leaves one alive).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import textwrap
import threading
import time
from typing import Any

import pytest
from dag_helpers import task_states, write_dag, xcom
from waiting import wait_for

from airflow_cloudtrain.catalog import rank_offers
from airflow_cloudtrain.contract.runs import RunKey, RunStatus, join, status_key
from airflow_cloudtrain.spec import Hardware
from airflow_cloudtrain.storage import open_run_folder

SECRET = "s3cr3t-Value-9f2"
# runs until the test ends it: every test that uses it acts while it runs (kills, interrupts, stops).
# 10 minutes bound it only if a test fails; 60 s was not enough beside another test run (the job
# ended on its own before a loaded machine got to the SIGTERM)
LONG_JOB = "trap 'echo got SIGTERM; exit 143' TERM; echo started; for i in $(seq 1 6000); do sleep 0.1; done"
SPOT = {"aws": "ec2spot", "gcp": "gcspot"}
ON_DEMAND = {"aws": "ec2", "gcp": "gcloud"}
BUCKET = {"aws": "s3://cloudtrain-emulated/tests", "gcp": "gs://cloudtrain-emulated/tests"}
REGION = {"aws": "us-east-1", "gcp": "us-central1"}
PROVIDERS = ["aws", "gcp"]


def scenario(
    dag_id: str,
    provider: str,
    command: str,
    spot: bool = True,
    deferrable: bool = False,
    extra: str = "",
    operator: str = "CloudTrainOperator",
    preamble: str = "",
) -> Any:
    cloud = (SPOT if spot else ON_DEMAND)[provider]
    header = "from datetime import datetime, timedelta\nfrom airflow.sdk import DAG\n"
    header += "from airflow_cloudtrain.operators import CloudTrainOperator\n"
    body = textwrap.dedent(
        f"""
        with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            {operator}(task_id="train", cloud={cloud!r}, cpus=2, ram="4g", command={command!r},
                       bucket={BUCKET[provider]!r}, region={REGION[provider]!r}, poll_interval=0.5,
                       deferrable={deferrable}, live_prices=False, env={{"WANDB_API_KEY": {SECRET!r}}} {extra})
        """
    )
    return write_dag(header + textwrap.dedent(preamble) + body, dag_id)


def folder_of(provider: str, dag_id: str, run: Any) -> Any:
    return open_run_folder(
        join(BUCKET[provider], RunKey(dag_id, "train", run.run_id, -1, BUCKET[provider]).path())
    )


def cloud_of(provider: str) -> Any:
    """The provider's ``Cloud`` on the emulator's default connection, one per connection: an AWS one
    builds three clients (0.1 s of CPU), and watchers call this on every poll."""
    conn = "AIRFLOW_CONN_AWS_DEFAULT" if provider == "aws" else "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"
    return _cloud_on(provider, os.environ.get(conn, ""))


@functools.lru_cache(maxsize=8)
def _cloud_on(provider: str, conn: str) -> Any:
    if provider == "aws":
        from airflow_cloudtrain.clouds.aws.ec2 import aws_cloud
        from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

        return aws_cloud(CloudTrainAwsHook(aws_conn_id="aws_default"))
    from airflow_cloudtrain.clouds.gcp.gce import gcp_cloud
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

    return gcp_cloud(CloudTrainGcpHook(), REGION["gcp"])


def launched(provider: str, dag_id: str, run: Any) -> list[str]:
    """Instance ids the run launched (each agent writes under instances/<id>/), all checked gone."""
    keys = folder_of(provider, dag_id, run).list("instances/")
    ids = sorted({k.split("/")[1] for k in keys})
    states = cloud_of(provider).describe(ids)
    assert all(states[i].state == "terminated" for i in ids), {i: states[i].state for i in ids}
    return ids


def status_of(provider: str, dag_id: str, run: Any, instance_id: str) -> RunStatus:
    text = folder_of(provider, dag_id, run).get_text(status_key(instance_id))
    assert text, "the agent wrote no status"
    return RunStatus.from_json(text)


def when_running(emu: Any, action: Any, timeout: float = 500) -> threading.Thread:
    """In the background: once an instance of ours runs and its job has printed, act on it (the
    deadline is for a loaded machine: parsing, launch and agent start come first)."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for inst in emu.running_instances():
                if "started" in emu.agent_log(inst["id"]):
                    action(inst["id"])
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("provider", PROVIDERS)
def test_failing_command_fails_the_task_and_terminates(emu, airflow_db, provider: str) -> None:
    dag_id = f"fail_cmd_{provider}"
    run = scenario(dag_id, provider, "echo about to fail; exit 3").test()
    assert task_states(run) == {"train": "failed"}
    (iid,) = launched(provider, dag_id, run)
    status = status_of(provider, dag_id, run, iid)
    assert (status.state, status.exit_code) == ("failed", 3)


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_spot_interruption_fails_with_a_spot_error(
    emu, airflow_db, capfd, provider: str, deferrable: bool
) -> None:
    dag_id = f"spot_{provider}_{int(deferrable)}"
    # the agent polls instance metadata every 5 s; AWS gives 2 minutes of notice, GCE about 30 s. A
    # 7 s notice left a loaded machine 2 s to get that poll in before the instance was taken (then
    # ended as a plain SIGTERM, not a spot interruption); GCE's 30 s leave it six polls (15 s were
    # too few beside another test run)
    watcher = when_running(emu, lambda iid: emu.interrupt(iid, notice_s=30))
    run = scenario(dag_id, provider, LONG_JOB, deferrable=deferrable).test()
    watcher.join(5)
    assert task_states(run) == {"train": "failed"}
    assert "spot interruption: " in capfd.readouterr().out
    (iid,) = launched(provider, dag_id, run)
    status = status_of(provider, dag_id, run, iid)
    assert status.state == "interrupted"
    assert status.interruption["kind"] == ("spot" if provider == "aws" else "preemption")
    folder = folder_of(provider, dag_id, run)
    log = "".join(folder.get_text(k) or "" for k in folder.list(f"instances/{iid}/logs/"))
    assert "got SIGTERM" in log  # the job was told, and could have saved a checkpoint


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_retry_after_a_kill_runs_the_job_again(emu, airflow_db, capfd, tmp_path, provider: str) -> None:
    """Terminating the instance makes its agent write "interrupted"; the retry must not deliver that
    as the run's result but run the job again."""
    dag_id = f"killretry_{provider}"
    # The first instance's job runs until the kill (a fixed sleep let a slow watcher miss it and
    # the first try succeed); the retry's job sees the mark and finishes. Emulated instances share
    # this machine's filesystem, which is what makes the mark visible to the second one.
    mark = tmp_path / "first-job-started"
    job = f"if [ -e '{mark}' ]; then echo trained; else touch '{mark}'; echo started; sleep 600; fi"
    before = signal.getsignal(signal.SIGTERM)
    try:
        watcher = when_running(emu, lambda iid: os.kill(os.getpid(), signal.SIGTERM))
        dag = scenario(
            dag_id,
            provider,
            job,
            spot=False,
            extra=", retries=1, retry_delay=timedelta(seconds=0)",
        )
        run = dag.test()
        watcher.join(5)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert task_states(run) == {"train": "success"}
    ids = launched(provider, dag_id, run)
    assert len(ids) == 2, ids  # the retry launched a second instance to run the job again
    result = xcom(run, "train")
    assert result["state"] == "succeeded" and not result["adopted"]
    assert status_of(provider, dag_id, run, result["instance_id"]).state == "succeeded"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_killed_task_terminates_its_instance(emu, airflow_db, provider: str) -> None:
    """SIGTERM to the task process is how Airflow kills a running task; on_kill must take the instance."""
    dag_id = f"killed_{provider}"
    before = signal.getsignal(signal.SIGTERM)
    try:
        watcher = when_running(emu, lambda iid: os.kill(os.getpid(), signal.SIGTERM))
        run = scenario(dag_id, provider, LONG_JOB, spot=False).test()
        watcher.join(5)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert task_states(run) == {"train": "failed"}
    (iid,) = launched(provider, dag_id, run)
    assert status_of(provider, dag_id, run, iid).state in ("running", "interrupted")  # the job never finished


def test_ec2_capacity_error_fails_over_to_the_next_offer(emu, airflow_db) -> None:
    first, second = rank_offers("ec2spot", Hardware(2, 0, "4g"), region="us-east-1")[:2]
    emu.fail_capacity(first.instance_type)
    emu.reset_counts()
    run = scenario("failover_aws", "aws", "echo ok").test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["failover"] == [[first.instance_type, "us-east-1", "InsufficientInstanceCapacity"]]
    assert result["instance_type"] == second.instance_type
    # a capacity answer moves on at once: one RunInstances per offer, not the SDK's five retries
    assert emu.request_counts().get("RunInstances") == 2


def test_gce_exhausted_zone_fails_over_to_the_next_zone(emu, airflow_db) -> None:
    offer = rank_offers("gcspot", Hardware(2, 0, "4g"), region="us-central1")[0]
    first_zone, second_zone = offer.zones[:2]
    emu.fail_capacity(offer.instance_type, zone=first_zone)
    run = scenario("failover_gcp", "gcp", "echo ok").test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["failover"] == [[offer.instance_type, first_zone, "ZONE_RESOURCE_POOL_EXHAUSTED"]]
    assert (result["instance_type"], result["zone"]) == (offer.instance_type, second_zone)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_no_capacity_anywhere_lists_what_was_tried(emu, airflow_db, capfd, provider: str) -> None:
    offers = rank_offers(SPOT[provider], Hardware(2, 0, "4g"), region=REGION[provider])[:2]
    for offer in offers:
        emu.fail_capacity(offer.instance_type)
    dag_id = f"nocapacity_{provider}"
    run = scenario(dag_id, provider, "echo ok", extra=", max_launch_attempts=2").test()
    assert task_states(run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "no capacity for any of 2 offers tried" in out
    assert f"{offers[0].instance_type} in " in out
    assert launched(provider, dag_id, run) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_no_credentials_in_user_data_xcom_or_logs(emu, airflow_db, capfd, tmp_path, provider: str) -> None:
    dag_id = f"nosecrets_{provider}"
    seen_metadata: dict[
        str, str
    ] = {}  # GCE deletes the instance at teardown: read its metadata while it runs
    read = tmp_path / "metadata-read"

    def read_metadata(iid: str) -> None:
        if provider == "gcp":
            seen_metadata.update(gce_metadata(emu, iid))
        read.touch()  # the job waits for this (not a fixed sleep), so the VM is still there to read

    watcher = when_running(emu, read_metadata)
    job = f"echo started; for i in $(seq 1 2400); do [ -e '{read}' ] && break; sleep 0.1; done; echo job ran"
    run = scenario(dag_id, provider, job).test()
    watcher.join(5)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    user_data = ec2_user_data(result["instance_id"]) if provider == "aws" else seen_metadata["startup-script"]
    assert "--run-uri" in user_data and "agent.zip" in user_data  # it is the real bootstrap
    logs = capfd.readouterr().out
    for where, text in {"user data": user_data, "XCom": json.dumps(result), "logs": logs}.items():
        assert SECRET not in text, where
        assert "aws_secret_access_key" not in text.lower() and "private_key" not in text.lower(), where


def ec2_user_data(instance_id: str) -> str:
    import base64

    import boto3

    raw = boto3.client("ec2").describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(raw["UserData"]["Value"]).decode()


def gce_metadata(emu: Any, name: str) -> dict[str, str]:
    return next(i["metadata"] for i in emu.gce.alive() if i["name"] == name)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_max_runtime_stops_the_job_and_the_instance(emu, airflow_db, capfd, provider: str) -> None:
    dag_id = f"maxruntime_{provider}"
    run = scenario(dag_id, provider, LONG_JOB, extra=", max_runtime='4s'").test()
    assert task_states(run) == {"train": "failed"}
    (iid,) = launched(provider, dag_id, run)
    status = status_of(provider, dag_id, run, iid)
    assert status.state == "timed_out" and "max_runtime" in capfd.readouterr().out + status.message


def test_ec2_volume_is_attached_and_survives_the_run(emu, airflow_db) -> None:
    import boto3

    ec2 = boto3.client("ec2")
    volume = ec2.create_volume(AvailabilityZone="us-east-1a", Size=10, Encrypted=True)["VolumeId"]
    try:
        run = scenario(
            "volume_aws", "aws", "echo ok", extra=f", volume_id={volume!r}, zone='us-east-1a'"
        ).test()
        assert task_states(run) == {"train": "success"}
        (iid,) = launched("aws", "volume_aws", run)
        state = ec2.describe_volumes(VolumeIds=[volume])["Volumes"][0]
        assert (
            state["State"] == "available"
        )  # detached when the instance went, and not deleted: it is the user's
    finally:
        ec2.delete_volume(VolumeId=volume)


def test_ec2_volume_that_cannot_attach_leaves_nothing_behind(emu, airflow_db, capfd) -> None:
    run = scenario("badvolume_aws", "aws", "echo ok", extra=", volume_id='vol-0123456789abcdef0'").test()
    assert task_states(run) == {"train": "failed"}
    assert "vol-0123456789abcdef0" in capfd.readouterr().out
    # the instance launched before the attach failed, and was terminated by us (the emu fixture checks too)
    import boto3

    short = RunKey("badvolume_aws", "train", run.run_id, -1, BUCKET["aws"]).short_id
    pages = boto3.client("ec2").describe_instances(
        Filters=[{"Name": "tag:cloudtrain-run", "Values": [short]}]
    )
    states = [i["State"]["Name"] for r in pages["Reservations"] for i in r["Instances"]]
    assert states == ["terminated"]


def test_gce_deferrable_run_without_a_region_is_torn_down(emu, airflow_db) -> None:
    """The catalog picks the region; the resumed task must still find the VM to delete."""
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import CloudTrainOperator
        with DAG("noregion_gcp", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            CloudTrainOperator(task_id="train", cloud="gcspot", cpus=2, command="echo ok",
                               bucket={BUCKET["gcp"]!r}, poll_interval=0.5, deferrable=True, live_prices=False)
        """
    )
    run = write_dag(source, "noregion_gcp").test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["region"] == rank_offers("gcspot", Hardware(2))[0].region
    assert emu.running_instances() == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_dead_agent_is_noticed_and_its_instance_terminated(
    emu, airflow_db, capfd, provider: str, deferrable: bool
) -> None:
    """The agent dies and the machine runs on: only the operator can end it, after the heartbeat stops."""
    dag_id = f"deadagent_{provider}_{int(deferrable)}"
    watcher = when_running(emu, emu.crash_agent)
    run = scenario(dag_id, provider, LONG_JOB, deferrable=deferrable, extra=", heartbeat_timeout='4s'").test()
    watcher.join(5)
    assert task_states(run) == {"train": "failed"}
    assert "the agent stopped beating" in capfd.readouterr().out
    (iid,) = launched(provider, dag_id, run)  # terminated: by the operator, since nothing else could


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_cloud_ends_the_instance_at_max_runtime_even_with_a_dead_agent(
    emu, airflow_db, capfd, provider: str
) -> None:
    """max_runtime becomes a cloud-side hard stop (EC2: the bootstrap's shutdown timer; GCE:
    scheduling.maxRunDuration), so a machine whose agent died still ends without the operator."""
    dag_id = f"hardstop_{provider}"
    watcher = when_running(emu, emu.crash_agent)
    # max_runtime 60 s puts the hard stop at 90 s; the emulator plays it 5x faster (18 s after launch),
    # long after the agent died and long before the agent's own 60 s timer could have mattered
    emu.hard_stop_scale, before = 0.2, emu.hard_stop_scale
    try:
        run = scenario(dag_id, provider, LONG_JOB, extra=", max_runtime='60s', heartbeat_timeout='1h'").test()
    finally:
        emu.hard_stop_scale = before
    watcher.join(5)
    assert task_states(run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "ended before the job finished" in out
    assert "stopped beating" not in out  # the cloud ended it, not the operator's watchdog


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_a_run_survives_30_percent_of_ec2_and_s3_calls_throttled(
    emu, airflow_db, capfd, deferrable: bool
) -> None:
    dag_id = f"throttled_aws_{int(deferrable)}"
    emu.throttle(rate=0.3, api=("ec2", "s3"))
    try:
        run = scenario(dag_id, "aws", "echo started; sleep 3; echo job ran", deferrable=deferrable).test()
        counts = emu.request_counts()
    finally:
        emu.clear_faults()
    assert task_states(run) == {"train": "success"}, capfd.readouterr().out[-3000:]
    assert any(k.startswith("throttled") and v for k, v in counts.items()), counts  # it was really throttled
    assert "job ran" in capfd.readouterr().out
    launched("aws", dag_id, run)


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_a_run_survives_30_percent_of_compute_engine_and_gcs_calls_throttled(
    emu, airflow_db, capfd, deferrable: bool
) -> None:
    """GCE answers a busy project with 429 rateLimitExceeded, inserts included: the launch asks again
    (the same request id: one VM), and so does every poll (found by the fault campaign, s009). The
    VM's insert is refused twice for certain, then the rule is lifted; 30% of the rest throughout."""
    dag_id = f"throttled_gcp_{int(deferrable)}"
    emu.throttle(rate=0.3, api=("compute", "storage"), seed=3)
    emu.throttle(rate=1.0, api="instances.insert", seed=None)

    def lift_after_two_refusals() -> None:
        wait_for(lambda: emu.request_counts().get("throttled:instances.insert", 0) >= 2, timeout=300)
        emu.throttle(rate=0.0, api="instances.insert", seed=None)

    lifter = threading.Thread(target=lift_after_two_refusals, daemon=True)
    lifter.start()
    try:
        run = scenario(dag_id, "gcp", "echo started; sleep 3; echo job ran", deferrable=deferrable).test()
        counts = emu.request_counts()
    finally:
        lifter.join(5)
        emu.clear_faults()
    assert task_states(run) == {"train": "success"}, capfd.readouterr().out[-3000:]
    assert counts.get("throttled:instances.insert", 0) >= 2, counts
    assert any(k.startswith("throttled:objects") and v for k, v in counts.items()), counts
    assert "job ran" in capfd.readouterr().out
    assert len(launched("gcp", dag_id, run)) == 1  # asked again, never a second VM


# each provider in one mode (the throttling tests above take both modes of both): EC2 blocking, GCE deferred
@pytest.mark.parametrize(("provider", "deferrable"), [("aws", False), ("gcp", True)], ids=["aws", "gcp"])
def test_a_run_survives_server_errors_on_30_percent_of_its_calls(
    emu, airflow_db, capfd, provider: str, deferrable: bool
) -> None:
    """A region's control plane has bad minutes: 30% of the EC2 and S3 calls (500/503), or of the
    Compute Engine and GCS calls (503 backendError), fail with a server error, both the operator's and
    the agent's; the launch is refused twice for certain. The run ends as it would have, on one
    instance."""
    dag_id = f"unavailable_{provider}_{int(deferrable)}"
    create = "RunInstances" if provider == "aws" else "instances.insert"
    emu.unavailable(rate=0.3, api=("ec2", "s3") if provider == "aws" else ("compute", "storage"), seed=5)
    emu.unavailable(rate=1.0, api=create, seed=None)  # the launch itself: refused twice for certain

    def lift_after_two_refusals() -> None:
        wait_for(lambda: emu.request_counts().get(f"unavailable:{create}", 0) >= 2, timeout=300)
        emu.unavailable(rate=0.0, api=create, seed=None)

    lifter = threading.Thread(target=lift_after_two_refusals, daemon=True)
    lifter.start()
    try:
        run = scenario(dag_id, provider, "echo started; sleep 3; echo job ran", deferrable=deferrable).test()
        counts = emu.request_counts()
    finally:
        lifter.join(5)
        emu.clear_faults()
    assert task_states(run) == {"train": "success"}, capfd.readouterr().out[-3000:]
    assert counts.get(f"unavailable:{create}", 0) >= 2, counts
    refused = {k: v for k, v in counts.items() if k.startswith("unavailable:") and v}
    assert len(refused) >= 3, counts  # several kinds of call really failed
    assert "job ran" in capfd.readouterr().out
    assert len(launched(provider, dag_id, run)) == 1


def test_a_timeout_during_a_gce_insert_leaves_no_vm(emu, airflow_db, capfd) -> None:
    """execution_timeout fires while the insert operation is still running: the VM exists but the
    create call never returned its name to us, so only the ledger's tag sweep can find it."""
    dag_id = "insert_timeout_gcp"
    emu.gce.op_delay, before = 20.0, emu.gce.op_delay
    try:
        run = scenario(dag_id, "gcp", "echo never", extra=", execution_timeout=timedelta(seconds=6)").test()
    finally:
        emu.gce.op_delay = before
    assert task_states(run) == {"train": "failed"}
    digest = RunKey(dag_id, "train", run.run_id, -1, BUCKET["gcp"]).digest
    # the delete operation itself takes a moment in the emulator
    wait_for(lambda: cloud_of("gcp").find(digest, ended=True) == [], message="the VM to be deleted")
    assert "Released instance" in capfd.readouterr().out
