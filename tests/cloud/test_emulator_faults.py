"""What the emulated clouds do to instances and requests by themselves: hard stops, and throttling.

Hard stops are the clouds' own (EC2: the bootstrap's ``CT_HARD_STOP_S`` powers the machine off; GCE:
``scheduling.maxRunDuration``), so an instance ends on time even when our agent is dead. Throttling
answers with each API's own error, so the SDKs' retry logic meets what it meets in production.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.endpoint
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError
from google.api_core import exceptions as gexc
from google.cloud import compute_v1, storage
from waiting import wait_for

from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.contract.bootstrap import render_user_data
from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.emulator.gcp.gce import EMULATOR_USER_AGENT, compute_client_kwargs
from airflow_cloudtrain.emulator.runner import MACHINE_MARKER
from airflow_cloudtrain.emulator.userdata import Bootstrap, parse_bootstrap

ZONE = "us-central1-a"
NO_RETRIES = Config(retries={"total_max_attempts": 1})
MANAGED = {"cloudtrain-managed": "true"}


def run_folder(scheme: str) -> str:
    """A run folder whose spec keeps the agent busy (sleep) until someone stops the machine."""
    uri = f"{scheme}://{DEFAULT_BUCKET}/faults/{uuid.uuid4().hex[:8]}"
    spec = runs.RunSpec(
        run_id="ct-faults",
        run_uri=uri,
        cloud="ec2" if scheme == "s3" else "gcloud",
        command="sleep 600",
        log_interval_s=0.2,
        heartbeat_interval_s=0.2,
        metadata_poll_s=0.2,
    )
    _, bucket, prefix = runs.split_uri(uri)
    if scheme == "s3":
        boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/{runs.SPEC_KEY}", Body=spec.to_json())
    else:
        storage.Client(project="cloudtrain-emulated").bucket(bucket).blob(
            f"{prefix}/{runs.SPEC_KEY}"
        ).upload_from_string(spec.to_json())
    return uri


def agent_status(uri: str, instance_id: str) -> dict[str, Any] | None:
    """The status the instance's agent wrote in the run folder, if any yet."""
    _, bucket, prefix = runs.split_uri(uri)
    key = f"{prefix}/{runs.status_key(instance_id)}"
    try:
        if uri.startswith("s3://"):
            return json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
        return json.loads(
            storage.Client(project="cloudtrain-emulated").bucket(bucket).blob(key).download_as_bytes()
        )
    except (ClientError, gexc.NotFound):
        return None


def machine_processes(emu: Any, instance_id: str) -> list[str]:
    """The command lines of the processes the emulated machine still runs here."""
    import psutil

    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MACHINE_MARKER) == f"{instance_id}@{emu.workdir}":
                out.append(" ".join(proc.cmdline()))
        except psutil.Error:
            continue
    return out


def running(uri: str, instance_id: str) -> bool:
    return (agent_status(uri, instance_id) or {}).get("state") == runs.RUNNING


# --- hard stops ----------------------------------------------------------------------------------


@pytest.fixture()
def hard_stops(emu) -> Iterator[Any]:
    """The emulator; tests may shorten hard stops (``hard_stop_scale``) once their agent has reported:
    the clouds' own minimum (GCE: 30 s) would make them slow, and a busy machine's agent start slower."""
    yield emu
    emu.hard_stop_scale = 1.0


def test_ec2_hard_stop_ends_the_instance_even_when_its_agent_is_dead(hard_stops) -> None:
    emu = hard_stops
    uri = run_folder("s3")
    user_data = render_user_data(uri, "ec2", hard_stop_s=30)
    assert "\nCT_HARD_STOP_S=30\n" in user_data
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    tags = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in MANAGED.items()]}]
    raw = ec2.run_instances(
        ImageId=image,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        UserData=user_data,
        TagSpecifications=tags,
    )["Instances"][0]
    iid, launched = raw["InstanceId"], raw["LaunchTime"].timestamp()  # EC2 keeps whole seconds

    # no run-uri tag: the agent starts from the user data, and reports in the run folder
    wait_for(lambda: running(uri, iid), message="the agent to start the job")

    def job() -> bool:
        return any("sleep 600" in cmd for cmd in machine_processes(emu, iid))

    wait_for(job, message="the job's process")
    emu.crash_agent(iid)
    assert emu.wait_until_idle(120)
    assert job()  # the job lives on (its own session), the machine too

    def state() -> dict[str, Any]:
        return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]

    assert state()["State"]["Name"] == "running"  # nobody powers it off... but the cloud, on time
    emu.hard_stop_scale = 0.2  # 30 s -> 6 s after launch
    ended = wait_for(lambda: (s := state())["State"]["Name"] == "terminated" and s, message="the hard stop")
    assert time.time() >= launched + 30 * 0.2
    assert ended["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
    assert ended["StateReason"]["Message"] == "Client.InstanceInitiatedShutdown: Instance initiated shutdown"
    wait_for(lambda: not machine_processes(emu, iid), message="the machine's processes to go with it")


@pytest.fixture()
def compute(emu) -> compute_v1.InstancesClient:
    return compute_v1.InstancesClient(**compute_client_kwargs(emu.gce_endpoint))


def gce_instance(name: str, script: str, **scheduling: Any) -> compute_v1.Instance:
    """An instance resource as the product builds it (snake_case fields, a Duration as a dict)."""
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/n1-standard-2",
        labels=MANAGED,
        disks=[
            {
                "boot": True,
                "auto_delete": True,
                "initialize_params": {"source_image": "projects/debian-cloud/global/images/family/debian-12"},
            }
        ],
        network_interfaces=[{"network": "global/networks/default"}],
        metadata={"items": [{"key": "startup-script", "value": script}]},
        scheduling={"automatic_restart": False, "on_host_maintenance": "TERMINATE", **scheduling},
    )


@pytest.mark.parametrize("action", ["DELETE", "STOP"])
def test_gce_max_run_duration_stops_or_deletes_the_vm_and_its_agent(hard_stops, compute, action: str) -> None:
    emu = hard_stops
    uri = run_folder("gs")
    name = f"vm-{uuid.uuid4().hex[:8]}"
    body = gce_instance(
        name,
        render_user_data(uri, "gcloud"),
        max_run_duration={"seconds": 30},
        instance_termination_action=action,
    )
    compute.insert(project="cloudtrain-emulated", zone=ZONE, instance_resource=body).result(timeout=120)
    created = time.time()
    got = compute.get(project="cloudtrain-emulated", zone=ZONE, instance=name)
    assert got.scheduling.max_run_duration.seconds == 30
    assert got.scheduling.instance_termination_action == action

    wait_for(
        lambda: running(uri, name), message="the agent to start the job"
    )  # started from the startup-script
    # the emulated guest may start its job within the VM's first fraction of a second, still STAGING
    wait_for(lambda: emu.gce.instance(ZONE, name)["status"] == "RUNNING", message="the VM to be RUNNING")
    emu.hard_stop_scale = 0.2  # 30 s -> 6 s after creation

    def gone_or_stopped() -> bool:
        raw = emu.gce.instance(ZONE, name)
        return raw is None if action == "DELETE" else raw is not None and raw["status"] == "TERMINATED"

    wait_for(gone_or_stopped, message=f"maxRunDuration's {action}")
    assert time.time() >= created + 30 * 0.2 - 0.5  # created: when the insert had returned
    assert emu.wait_until_idle(120)  # its agent was killed with the machine
    wait_for(lambda: not machine_processes(emu, name), message="the machine's processes to go with it")
    assert agent_status(uri, name)["state"] not in (runs.SUCCEEDED, runs.FAILED)
    if action == "DELETE":
        with pytest.raises(gexc.NotFound):
            compute.get(project="cloudtrain-emulated", zone=ZONE, instance=name)
    else:
        assert compute.get(project="cloudtrain-emulated", zone=ZONE, instance=name).status == "TERMINATED"
        compute.delete(project="cloudtrain-emulated", zone=ZONE, instance=name).result(timeout=120)


@pytest.mark.parametrize(
    ("scheduling", "message"),
    [
        (
            {"max_run_duration": {"seconds": 600}},
            "'resource.scheduling.instanceTerminationAction' not specified",
        ),
        (
            {"max_run_duration": {"seconds": 29}, "instance_termination_action": "DELETE"},
            "between 30 seconds",
        ),
        (
            {"max_run_duration": {"seconds": 120 * 86400 + 1}, "instance_termination_action": "STOP"},
            "and 120 days",
        ),
    ],
    ids=["no termination action", "too short", "too long"],
)
def test_gce_max_run_duration_is_validated_like_the_real_api(
    emu, compute, scheduling: dict, message: str
) -> None:
    name = f"vm-{uuid.uuid4().hex[:8]}"
    with pytest.raises(gexc.BadRequest) as info:
        compute.insert(
            project="cloudtrain-emulated",
            zone=ZONE,
            instance_resource=gce_instance(name, "#!/bin/sh\n", **scheduling),
        )
    assert message in str(info.value) and info.value.errors[0]["domain"] == "global"
    assert emu.gce.instance(ZONE, name) is None


def test_an_instance_without_our_bootstrap_gets_no_agent(emu) -> None:
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    tags = [
        {
            "ResourceType": "instance",
            "Tags": [
                {"Key": "cloudtrain-run-uri", "Value": "s3://b/r"},
                {"Key": "cloudtrain-managed", "Value": "true"},
            ],
        }
    ]
    iid = ec2.run_instances(
        ImageId=image,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=tags,
        UserData="#!/bin/bash\necho CT_RUN_URI is not set here\n",
    )["Instances"][0]["InstanceId"]
    try:
        wait_for(lambda: iid in emu._aws._boot, message="the emulator to read the user data")
        assert emu._aws._boot[iid] is None and emu.agent_log(iid) == ""
    finally:
        ec2.terminate_instances(InstanceIds=[iid])


def test_the_bootstrap_lines_the_emulator_reads() -> None:
    script = render_user_data("s3://b/runs/it's here", "ec2spot", hard_stop_s=90)
    assert parse_bootstrap(script) == Bootstrap("s3://b/runs/it's here", "ec2spot", 90)
    assert parse_bootstrap(render_user_data("gs://b/r", "gcloud").encode()) == Bootstrap(
        "gs://b/r", "gcloud", None
    )
    assert parse_bootstrap("#!/bin/bash\nCT_RUN_URI=\nCT_HARD_STOP_S=60\n") is None  # no run folder: not ours
    assert parse_bootstrap("#!/bin/bash\necho hello\n") is None and parse_bootstrap(None) is None


# --- throttling ----------------------------------------------------------------------------------


@pytest.fixture()
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """botocore's retry decisions stay real; its back-off sleeps are recorded, not slept (they would
    add some 15 s to 50 calls at a 30 % throttle rate)."""
    slept: list[float] = []
    monkeypatch.setattr(botocore.endpoint, "time", type("Clock", (), {"sleep": staticmethod(slept.append)}))
    return slept


def test_ec2_throttling_is_request_limit_exceeded(emu, no_backoff: list[float]) -> None:
    plain = boto3.client("ec2", config=NO_RETRIES)
    nothing = [{"Name": "tag:cloudtrain-run", "Values": ["none-such"]}]
    emu.throttle(rate=1.0, api="DescribeInstances")
    emu.reset_counts()
    with pytest.raises(ClientError) as info:
        plain.describe_instances(Filters=nothing)
    assert info.value.response["Error"]["Code"] == "RequestLimitExceeded"
    assert info.value.response["Error"]["Message"] == "Request limit exceeded."
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    plain.describe_regions()  # other actions are not throttled
    own = boto3.client(
        "ec2", config=Config(user_agent_extra=EMULATOR_USER_AGENT, retries={"total_max_attempts": 1})
    )
    own.describe_instances(Filters=nothing)  # nor the emulator's own calls, which are not counted either
    assert emu.request_counts() == {
        "DescribeInstances": 1,
        "throttled:DescribeInstances": 1,
        "DescribeRegions": 1,
    }

    emu.throttle(rate=0.3, api="DescribeInstances")
    emu.reset_counts()
    default = boto3.client("ec2")  # the SDK's default retries (legacy mode: 5 attempts)
    ok = 0
    for _ in range(50):
        try:
            default.describe_instances(Filters=nothing)
            ok += 1
        except ClientError as err:
            assert err.response["Error"]["Code"] == "RequestLimitExceeded"
    counts = emu.request_counts()
    assert ok >= 45 and no_backoff
    assert 5 <= counts["throttled:DescribeInstances"] <= 40
    assert (
        counts["DescribeInstances"] - counts["throttled:DescribeInstances"] == ok
    )  # every other attempt passed

    emu.clear_faults()
    for _ in range(10):
        plain.describe_instances(Filters=nothing)


def test_s3_throttling_is_slow_down(emu, no_backoff: list[float]) -> None:
    plain = boto3.client("s3", config=NO_RETRIES)
    key = f"faults/{uuid.uuid4().hex[:8]}/object"
    plain.put_object(Bucket=DEFAULT_BUCKET, Key=key, Body=b"x" * 1000)
    emu.throttle(rate=1.0, api="s3")
    for call in (
        lambda: plain.get_object(Bucket=DEFAULT_BUCKET, Key=key),
        lambda: plain.put_object(Bucket=DEFAULT_BUCKET, Key=key, Body=b"y" * 100_000),
        lambda: plain.list_objects_v2(Bucket=DEFAULT_BUCKET, Prefix="faults/"),
    ):
        with pytest.raises(ClientError) as info:
            call()
        assert info.value.response["Error"]["Code"] == "SlowDown"
        assert info.value.response["Error"]["Message"] == "Please reduce your request rate."
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    boto3.client("ec2", config=NO_RETRIES).describe_regions()  # EC2 is another service
    counts = emu.request_counts()
    assert (
        counts["throttled:GetObject"] and counts["throttled:PutObject"] and counts["throttled:ListObjectsV2"]
    )

    emu.throttle(rate=0.3, api=["GetObject", "PutObject"])
    emu.throttle(rate=0, api="s3")  # lifts the service-wide rule, keeps the per-operation ones
    default = boto3.client("s3")
    ok = 0
    for i in range(50):
        try:
            if i % 2:
                assert default.get_object(Bucket=DEFAULT_BUCKET, Key=key)["Body"].read() == b"x" * 1000
            else:
                default.put_object(Bucket=DEFAULT_BUCKET, Key=key, Body=b"x" * 1000)
            ok += 1
        except ClientError as err:
            assert err.response["Error"]["Code"] == "SlowDown"
    assert ok >= 45 and no_backoff

    emu.clear_faults()
    for _ in range(10):
        plain.head_object(Bucket=DEFAULT_BUCKET, Key=key)


def test_throttling_draws_are_reproducible(emu) -> None:
    plain = boto3.client("ec2", config=NO_RETRIES)

    def outcomes() -> list[bool]:
        out = []
        for _ in range(20):
            try:
                plain.describe_availability_zones()
                out.append(True)
            except ClientError:
                out.append(False)
        return out

    emu.throttle(rate=0.5, api="DescribeAvailabilityZones", seed=7)
    first = outcomes()
    emu.throttle(rate=0.5, api="DescribeAvailabilityZones", seed=7)
    assert outcomes() == first and 0 < sum(first) < 20


def test_gcp_throttling_is_rate_limit_exceeded(emu) -> None:
    instances = compute_v1.InstancesClient(**compute_client_kwargs(emu.gce_endpoint))
    bucket = storage.Client(project="cloudtrain-emulated").bucket(DEFAULT_BUCKET)
    bucket.blob("faults/gcs-object").upload_from_string(b"gcs")
    emu.throttle(rate=1.0, api=("compute", "storage"))
    emu.reset_counts()
    with pytest.raises(gexc.TooManyRequests) as info:
        list(instances.list(project="cloudtrain-emulated", zone=ZONE))
    assert info.value.errors[0]["reason"] == "rateLimitExceeded"
    with pytest.raises(gexc.TooManyRequests) as info:
        bucket.blob("faults/gcs-object").download_as_bytes(retry=None)
    assert "rateLimitExceeded" in str(info.value)  # media: the JSON error is in the message
    with pytest.raises(gexc.TooManyRequests) as info:
        bucket.blob("faults/gcs-object").reload(retry=None)
    assert info.value.errors[0]["reason"] == "rateLimitExceeded"
    counts = emu.request_counts()  # (besides, the storage client reads the bucket now and then on its own)
    wanted = {
        "instances.list": 1,
        "throttled:instances.list": 1,
        "objects.get": 2,
        "throttled:objects.get": 2,
    }
    assert {k: counts.get(k) for k in wanted} == wanted
    emu.clear_faults()
    list(instances.list(project="cloudtrain-emulated", zone=ZONE))
    assert bucket.blob("faults/gcs-object").download_as_bytes(retry=None) == b"gcs"


def test_the_aws_endpoint_sends_one_server_header(emu) -> None:
    """moto adds ``Server: amazon.com`` to the HTTP server's own; aiohttp (debug mode) rejects two."""
    for response in (boto3.client("ec2").describe_regions(), boto3.client("s3").list_buckets()):
        raw = response["ResponseMetadata"]["HTTPHeaders"]
        assert "," not in raw.get("server", "")  # botocore joins repeated headers with ", "


def test_writes_under_a_run_folder_fail_for_the_side_asked_while_reads_go_on(emu) -> None:
    """``fail_writes``: the writes under one prefix (a run folder) get the store's server error, from the
    side asked; reads of that folder, and writes elsewhere, go on."""
    folder = f"faults/{uuid.uuid4().hex[:8]}/"
    s3 = boto3.client("s3", config=NO_RETRIES)
    s3.put_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}spec.json", Body=b"{}")
    bucket = storage.Client(project="cloudtrain-emulated").bucket(DEFAULT_BUCKET)
    bucket.blob(f"{folder}spec.json").upload_from_string(b"{}")
    session = bucket.blob(f"{folder}big.bin").create_resumable_upload_session()  # before the fault
    emu.fail_writes(f"s3://{DEFAULT_BUCKET}/{folder}")  # both sides
    emu.fail_writes(f"gs://{DEFAULT_BUCKET}/{folder}", side="airflow")  # this test is the Airflow side
    try:
        for write in (
            lambda: s3.put_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}status.json", Body=b"{}"),
            lambda: s3.create_multipart_upload(Bucket=DEFAULT_BUCKET, Key=f"{folder}ckpt/model.pt"),
        ):
            with pytest.raises(ClientError) as info:
                write()
            assert info.value.response["Error"]["Code"] == "InternalError"
            assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        with pytest.raises(gexc.ServiceUnavailable):  # a multipart upload: the name is in its body
            bucket.blob(f"{folder}status.json").upload_from_string(b"{}", retry=None)
        assert requests.put(session, data=b"x" * 10).status_code == 503  # a resumable upload's session
        assert s3.get_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}spec.json")["Body"].read() == b"{}"
        assert bucket.blob(f"{folder}spec.json").download_as_bytes(retry=None) == b"{}"
        s3.put_object(Bucket=DEFAULT_BUCKET, Key="faults/elsewhere.json", Body=b"{}")
        bucket.blob(f"{folder[:-1]}-sibling/x.json").upload_from_string(b"{}", retry=None)
        emu.fail_writes(f"gs://{DEFAULT_BUCKET}/{folder}", side="airflow", rate=0.0, seed=None)  # lifted
        emu.fail_writes(f"gs://{DEFAULT_BUCKET}/{folder}", side="instance", seed=None)  # the agents only
        bucket.blob(f"{folder}status.json").upload_from_string(b"{}", retry=None)
    finally:
        emu.clear_faults()
    s3.put_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}status.json", Body=b"{}")
    assert emu.request_counts().get("unavailable:PutObject") == 1


def test_writes_under_a_run_folder_can_be_refused_as_access_denied(emu) -> None:
    """``fail_writes(kind="denied")``: what a bucket policy or an IAM change that lands mid-run does to a
    run folder: S3's 403 ``AccessDenied``, GCS's 403 naming ``storage.objects.create``; reads go on."""
    folder = f"faults/{uuid.uuid4().hex[:8]}/"
    s3 = boto3.client("s3", config=NO_RETRIES)
    bucket = storage.Client(project="cloudtrain-emulated").bucket(DEFAULT_BUCKET)
    s3.put_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}spec.json", Body=b"{}")
    with pytest.raises(ValueError, match="kind must be one of"):
        emu.fail_writes(f"s3://{DEFAULT_BUCKET}/{folder}", kind="throttled")
    emu.fail_writes(f"s3://{DEFAULT_BUCKET}/{folder}", kind="denied")
    emu.fail_writes(f"gs://{DEFAULT_BUCKET}/{folder}", kind="denied", seed=None)
    try:
        with pytest.raises(ClientError) as info:
            s3.put_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}status.json", Body=b"{}")
        assert info.value.response["Error"]["Code"] == "AccessDenied"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        with pytest.raises(gexc.Forbidden, match="storage.objects.create"):
            bucket.blob(f"{folder}status.json").upload_from_string(b"{}", retry=None)
        assert s3.get_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}spec.json")["Body"].read() == b"{}"
        emu.fail_writes(f"s3://{DEFAULT_BUCKET}/{folder}", 0.0, kind="denied", seed=None)  # lifted
        s3.put_object(Bucket=DEFAULT_BUCKET, Key=f"{folder}status.json", Body=b"{}")
    finally:
        emu.clear_faults()
    counts = emu.request_counts()
    assert counts.get("denied:PutObject") == 1 and counts.get("denied:objects.insert") == 1, counts
