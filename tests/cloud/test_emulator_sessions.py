"""Two ``with Emulator() as emu:`` sessions in one process, as a user's own test module has them.

moto's backends are process-wide: before the fix the second session found the first one's queues,
buckets and groups. Each session now starts from empty accounts on both clouds; one started while
another runs shares that one's AWS account (a reset would wipe it) and warns. The sessions run in a
subprocess of their own: this test process may already hold the suite's shared Emulator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json
    import logging
    import sys

    import boto3
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from airflow_cloudtrain.emulator import DEFAULT_BUCKET, Emulator
    from airflow_cloudtrain.emulator.aws.images import an_image


    def account():
        ec2 = boto3.client("ec2")
        asg = boto3.client("autoscaling")
        gcs = storage.Client(project="cloudtrain-emulated", credentials=AnonymousCredentials())
        live = [
            i["InstanceId"]
            for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"]
            if i["State"]["Name"] in ("pending", "running")
        ]
        return {
            "queues": [q.rsplit("/", 1)[-1] for q in boto3.client("sqs").list_queues().get("QueueUrls", [])],
            "s3": sorted(b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]),
            "groups": [g["AutoScalingGroupName"] for g in asg.describe_auto_scaling_groups()["AutoScalingGroups"]],
            "templates": [t["LaunchTemplateName"] for t in ec2.describe_launch_templates()["LaunchTemplates"]],
            "instances": live,
            "gcs": sorted(b.name for b in gcs.list_buckets()),
        }


    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
    mark = logging.getLogger("marks").info
    out = {}
    mark("starting 1")
    with Emulator() as emu:
        mark("started 1")
        boto3.client("sqs").create_queue(QueueName="first-session-queue")
        boto3.client("s3").create_bucket(Bucket="first-session-bucket")
        ec2 = boto3.client("ec2")
        image = an_image(ec2)
        ec2.create_launch_template(
            LaunchTemplateName="first-session-template",
            LaunchTemplateData={"ImageId": image, "InstanceType": "m5.large"},
        )
        boto3.client("autoscaling").create_auto_scaling_group(
            AutoScalingGroupName="first-session-group",
            LaunchTemplate={"LaunchTemplateName": "first-session-template"},
            MinSize=0, MaxSize=1, DesiredCapacity=1, AvailabilityZones=["us-east-1a"],
        )
        storage.Client(project="cloudtrain-emulated", credentials=AnonymousCredentials()).create_bucket(
            "first-session-gcs"
        )
        out["first"] = account()
        with Emulator():  # one started while another runs shares its account: nothing is wiped
            out["nested"] = account()
        out["first_after_nested"] = account()
    mark("starting 2")
    with Emulator() as emu:
        mark("started 2")
        out["second"] = account()
    print("RESULT " + json.dumps(out))
    """
)


def test_each_session_starts_from_empty_accounts(tmp_path: Path) -> None:
    script = tmp_path / "two_sessions.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW_CONN_", "STORAGE_"))}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))

    first = out["first"]  # what the first session made is there while it runs
    assert first["queues"] == ["first-session-queue"]
    assert "first-session-bucket" in first["s3"] and "first-session-gcs" in first["gcs"]
    assert first["groups"] == ["first-session-group"] and len(first["instances"]) == 1

    second = out["second"]  # the next session: empty accounts, only the default buckets
    assert second == {
        "queues": [],
        "s3": ["cloudtrain-emulated"],
        "groups": [],
        "templates": [],
        "instances": [],
        "gcs": ["cloudtrain-emulated"],
    }
    # an Emulator started while another runs (a suite's shared one, and a test's own) shares its AWS
    # account rather than wiping it, and says so; its GCP side is its own
    for seen in (out["nested"], out["first_after_nested"]):
        assert {k: v for k, v in seen.items() if k != "gcs"} == {k: v for k, v in first.items() if k != "gcs"}
    assert out["nested"]["gcs"] == ["cloudtrain-emulated"]
    assert "Another Emulator is running in this process" in done.stderr

    # starting a session builds the emulator's own boto3 clients: botocore's "Found endpoint ..." and
    # "Found credentials ..." INFO lines are not the user's business (the script's own clients log them)
    log = done.stderr
    for n in (1, 2):
        start = log.index(f"marks starting {n}")
        starting = log[start : log.index(f"marks started {n}", start)]
        assert "Found endpoint" not in starting and "Found credentials" not in starting, starting[-2000:]
