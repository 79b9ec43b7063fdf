"""The permission documents: generated from the committed record of calls, never edited by hand, scoped
by the run-key tag where AWS allows it, and printed by ``cloudtrain permissions``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from airflow_cloudtrain import permissions
from airflow_cloudtrain.cli import main
from airflow_cloudtrain.emulator import calls
from airflow_cloudtrain.permissions import catalog_calls, folder_calls, generate
from airflow_cloudtrain.permissions.actions import permissions_for


def needed(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The record's calls as the generator takes them (``generate.needed``)."""
    return generate.needed(rows)


def test_the_documents_are_what_the_record_generates() -> None:
    assert generate.stale(generate.load_record()) == [], (
        "run: python -m airflow_cloudtrain.permissions.generate"
    )


def test_each_document_grants_exactly_what_its_recorded_calls_need() -> None:
    rows = needed(generate.load_record())
    for file in sorted(permissions.DATA.glob("*.json")):
        operator, provider, side, _ = file.name.split(".")
        need = {
            p
            for r in rows
            if (r["operator"], r["provider"], r["side"]) == (operator, provider, side)
            for p in permissions_for(provider, r["service"], r["operation"])
        }
        assert permissions.granted(json.loads(file.read_text())) == need, file.name


def test_every_operator_that_refreshes_the_catalog_may_refresh_it() -> None:
    """A cold cache's refresh on each cloud the operator runs on is granted to it, whichever test's run
    happened to refresh first while the calls were recorded (the cache is shared)."""
    takers = catalog_calls.refreshing_operators()
    assert takers == {
        "CloudTrainOperator": {"aws", "gcp"},
        "CheckpointResumeOperator": {"aws", "gcp"},
        "SpotFleetOperator": {"aws"},
        "PreemptibleGroupOperator": {"gcp"},
    }
    for operator, providers in takers.items():
        for provider in providers:
            granted = permissions.granted(permissions.document(operator, provider, "airflow") or {})
            for service, operation in catalog_calls.refresh_calls(provider):
                assert set(permissions_for(provider, service, operation)) <= granted, (
                    operator,
                    provider,
                    operation,
                )


def test_every_work_queue_operator_may_delete_an_earlier_trys_failed_outcomes() -> None:
    """A retry that finds a failed item's outcome deletes it (``lifecycle/fleet/run.py``): granted to
    each work-queue operator on its cloud, whether or not the recording run's retries met one (the
    recorded EC2 document lacked it, so a real retry would have been refused)."""
    assert folder_calls.work_queue_operators() == {"SpotFleetOperator", "PreemptibleGroupOperator"}
    for operator, provider, action in (
        ("SpotFleetOperator", "aws", "s3:DeleteObject"),
        ("PreemptibleGroupOperator", "gcp", "storage.objects.delete"),
    ):
        assert action in permissions.granted(permissions.document(operator, provider, "airflow") or {})
    # taken from the code, not from a recording: a record without the delete still grants it
    rows = [r for r in generate.load_record() if r["operation"] not in ("DeleteObjects", "objects.delete")]
    fleet = {
        (r["side"], r["operation"]) for r in generate.needed(rows) if r["operator"] == "SpotFleetOperator"
    }
    assert ("airflow", "DeleteObjects") in fleet


def test_every_agent_may_clear_a_checkpoint_version_before_its_upload() -> None:
    """An agent clears a checkpoint version's folder before uploading it, aborting incomplete S3
    multipart uploads first (``RunFolder.delete_prefix``): every operator's instance side may, on each
    cloud it runs on (``CloudTrainOperator``'s recorded EC2 document could not list the uploads)."""
    aws = {"s3:ListBucketMultipartUploads", "s3:AbortMultipartUpload", "s3:ListBucket", "s3:DeleteObject"}
    for operator in ("CloudTrainOperator", "CheckpointResumeOperator", "SpotFleetOperator"):
        assert aws <= permissions.granted(permissions.document(operator, "aws", "instance") or {}), operator
    gcp = {"storage.objects.list", "storage.objects.delete"}
    for operator in ("CloudTrainOperator", "CheckpointResumeOperator", "PreemptibleGroupOperator"):
        assert gcp <= permissions.granted(permissions.document(operator, "gcp", "instance") or {}), operator
    assert not permissions.document("CloudTrainGcOperator", "aws", "instance")  # it runs no agent


def test_a_hand_edit_or_a_grant_nothing_calls_is_caught(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    shutil.copytree(permissions.DATA, folder)
    rows = generate.load_record()
    assert generate.stale(rows, folder) == []
    name = "CloudTrainOperator.aws.airflow.json"
    doc = json.loads((folder / name).read_text())
    doc["Statement"].append({"Effect": "Allow", "Action": ["ec2:DeleteVpc"], "Resource": "*"})
    (folder / name).write_text(generate.render(doc))
    (folder / "CloudTrainOperator.aws.extra.json").write_text("{}\n")
    assert generate.stale(rows, folder) == ["CloudTrainOperator.aws.extra.json", name]


def test_a_call_the_documents_lack_is_named() -> None:
    row = {"provider": "aws", "side": "airflow", "service": "ec2", "operation": "DeleteVpc"}
    assert permissions.missing([{"operator": "CloudTrainOperator", **row}]) == [
        "CloudTrainOperator (aws, airflow side) calls ec2 DeleteVpc: needs ec2:DeleteVpc"
    ]
    new = {"provider": "gcp", "side": "instance", "service": "storage", "operation": "objects.weird"}
    assert "storage.objects.weird" in permissions.missing([{"operator": "CloudTrainOperator", **new}])[0]
    recorded = generate.load_record()
    assert recorded and permissions.missing(recorded) == []


def test_aws_policies_touch_only_tagged_resources() -> None:
    doc = permissions.document("CloudTrainOperator", "aws", "airflow")
    assert doc is not None
    by_action: dict[str, list[dict]] = {}
    for st in doc["Statement"]:
        for action in st["Action"]:
            by_action.setdefault(action, []).append(st)
    tag = "cloudtrain-run-key"
    (terminate,) = by_action["ec2:TerminateInstances"]
    assert terminate["Condition"] == {"StringLike": {f"aws:ResourceTag/{tag}": "*"}}
    launch = {st["Sid"]: st for st in by_action["ec2:RunInstances"]}
    assert launch["RunInstancesTagged"]["Condition"] == {"StringLike": {f"aws:RequestTag/{tag}": "*"}}
    assert launch["RunInstancesTagged"]["Resource"] == [
        "arn:aws:ec2:*:*:instance/*",
        "arn:aws:ec2:*:*:volume/*",
    ]
    assert "Condition" not in launch["RunInstancesUses"]  # the image, subnet, ... it only uses
    (pass_role,) = by_action["iam:PassRole"]
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    assert "ec2:DescribeInstances" in by_action and "ec2:DeleteVpc" not in by_action


def test_queues_and_parameters_the_provider_names_are_granted_by_name_only() -> None:
    """A fleet's role reaches only its own ``ct-`` queues; a run's secrets are written and deleted only
    under ``/cloudtrain/``; the Airflow side reads only the public AMI parameters (``/aws/service/...``),
    the instance side any parameter (``secret_env`` names the user's: ``--secret`` narrows it); listing stays
    open (no resource to scope)."""

    def grants(operator: str, side: str) -> dict[str, list[object]]:
        doc = permissions.document(operator, "aws", side)
        assert doc is not None
        out: dict[str, list[object]] = {}
        for st in doc["Statement"]:
            for action in st["Action"]:
                out.setdefault(action, []).append(st["Resource"])
        return out

    queues, params = ["arn:aws:sqs:*:*:ct-*"], ["arn:aws:ssm:*:*:parameter/cloudtrain/*"]
    fleet = grants("SpotFleetOperator", "airflow")
    for action in ("sqs:CreateQueue", "sqs:DeleteQueue", "sqs:SendMessageBatch", "sqs:GetQueueAttributes"):
        assert fleet[action] == [queues], action
    worker = grants("SpotFleetOperator", "instance")
    for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"):
        assert worker[action] == [queues], action
    single = grants("CloudTrainOperator", "airflow")
    assert single["ssm:PutParameter"] == single["ssm:DeleteParameters"] == [params]
    assert single["ssm:GetParameter"] == [["arn:aws:ssm:*:*:parameter/aws/service/*"]]
    assert single["ssm:DescribeParameters"] == ["*"]
    assert grants("CloudTrainOperator", "instance")["ssm:GetParameter"] == [["arn:aws:ssm:*:*:parameter/*"]]
    assert grants("CloudTrainGcOperator", "airflow")["sqs:ListQueues"] == ["*"]


def test_the_instance_side_gets_its_own_narrow_documents() -> None:
    airflow = permissions.granted(permissions.document("CloudTrainOperator", "aws", "airflow"))
    instance = permissions.granted(permissions.document("CloudTrainOperator", "aws", "instance"))
    assert "s3:PutObject" in instance and "ec2:RunInstances" not in instance
    assert "ec2:RunInstances" in airflow
    gcp = permissions.document("CloudTrainOperator", "gcp", "instance")
    assert gcp is not None and "storage.objects.create" in gcp["includedPermissions"]
    assert "compute.instances.create" not in gcp["includedPermissions"]


def test_the_cli_prints_a_policy_and_a_role(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["permissions", "--cloud", "ec2spot", "--operator", "CheckpointResumeOperator"]
    assert main([*argv, "--side", "airflow", "--format", "json"]) == 0
    policy = json.loads(capsys.readouterr().out)
    assert policy == permissions.document("CheckpointResumeOperator", "aws", "airflow")
    assert main([*argv, "--side", "instance", "--format", "json", "--bucket", "my-runs"]) == 0
    scoped = json.loads(capsys.readouterr().out)
    (bucket,) = [st for st in scoped["Statement"] if st.get("Sid") == "RunFolderBucket"]
    assert bucket["Resource"] == ["arn:aws:s3:::my-runs", "arn:aws:s3:::my-runs/*"]
    assert not any(
        a.startswith("s3:") for st in scoped["Statement"] if st is not bucket for a in st["Action"]
    )
    assert main(["permissions", "--cloud", "gcspot", "--operator", "PreemptibleGroupOperator"]) == 0
    text = capsys.readouterr().out
    assert "PreemptibleGroupOperator on gcspot (gcp), airflow side: custom role" in text
    assert "compute.instanceGroupManagers.create" in text


def test_the_emulator_tells_the_sides_apart() -> None:
    signed = "AWS4-HMAC-SHA256 Credential={}/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host"
    assert calls.aws_side(signed.format(calls.AIRFLOW_ACCESS_KEY)) == "airflow"
    assert calls.aws_side(signed.format(calls.INSTANCE_ACCESS_KEY)) == "instance"
    assert calls.aws_side(signed.format("testing")) == "other"  # a test's own client
    assert calls.aws_side("", f"X-Amz-Credential={calls.INSTANCE_ACCESS_KEY}%2F20260101") == "instance"
    assert calls.google_side(calls.instance_url("http://127.0.0.1:5000").split("//")[1]) == "instance"
    assert calls.google_side("127.0.0.1:5000") == "airflow"
