"""``secret_env`` at DAG parse time: references of the task's cloud or Airflow's, nothing else; and the
agent-side parsing and log redaction of the same references."""

from __future__ import annotations

import re
import socket

import pytest

from airflow_cloudtrain.contract.secret_refs import (
    AIRFLOW_CONN,
    AWS_SECRETSMANAGER,
    AWS_SSM,
    GCP_SECRET,
    parse_ref,
)
from airflow_cloudtrain.operators import CheckpointResumeOperator, CloudTrainOperator, SpotFleetOperator

AWS = {"cloud": "ec2", "bucket": "s3://bkt/p"}
GCP = {"cloud": "gcloud", "bucket": "gs://bkt/p"}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("network used at DAG parse time")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def make(cls=CloudTrainOperator, **kw):
    return cls(**{"task_id": "t", "command": "python train.py", **AWS, **kw})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"secret_env": {"API_TOKEN": "hunter2-plain"}}, "Put plain values in env and secrets in secret_env"),
        ({"secret_env": {"API_TOKEN": "vault://kv/token"}}, "its scheme 'vault' is unknown"),
        ({"secret_env": {"API_TOKEN": "aws-ssm://"}}, "secret_env['API_TOKEN']='aws-ssm://' is not valid"),
        (
            {"secret_env": {"API_TOKEN": "gcp-secret://projects/p-1234/secrets/tok"}},
            "is a GCP secret but cloud='ec2' runs on AWS",
        ),
        (
            {**GCP, "secret_env": {"API_TOKEN": "aws-ssm:///team/token"}},
            "is a AWS secret but cloud='gcloud' runs on GCP",
        ),
        (
            {**GCP, "secret_env": {"K": "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-AbCdEf"}},
            "runs on GCP",
        ),
        (
            {"env": {"API_TOKEN": "x"}, "secret_env": {"API_TOKEN": "aws-ssm:///team/token"}},
            "secret_env['API_TOKEN'] is also in env",
        ),
        ({"secret_env": {1: "aws-ssm:///team/token"}}, "secret_env key 1 is not valid"),
        ({"secret_env": {"1BAD": "aws-ssm:///team/token"}}, "secret_env key '1BAD' is not valid"),
        (
            {"secret_env": {"API_TOKEN": 42}},
            "secret_env['API_TOKEN']=42 is not valid: use a secret reference",
        ),
        ({"secret_env": {"API_TOKEN": None}}, "secret_env['API_TOKEN']=None is not valid"),
        (
            {"secret_env": "aws-ssm:///team/token"},
            "secret_env='aws-ssm:///team/token' is not valid: use a dict",
        ),
        ({"secret_env": {"CLOUDTRAIN_RUN_ID": "airflow_var://x"}}, "CLOUDTRAIN_ are the agent's own"),
        ({"secret_env": {"T": "airflow_conn://db/secret"}}, "is not valid"),
        ({"secret_env": {"T": "aws-ssm:///a#key"}}, "is not valid"),
        ({"secret_env": {"T": "projects/p-1234/secrets/tok"}}, "it is not a secret reference"),
    ],
)
def test_bad_secret_env_fails_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make(**kwargs)


def test_a_plain_value_is_never_echoed_whole() -> None:
    with pytest.raises(ValueError) as err:
        make(secret_env={"API_TOKEN": "sk-live-0123456789"})
    assert "sk-live-0123456789" not in str(err.value) and "'API_TOKEN'" in str(err.value)


@pytest.mark.parametrize(
    "ref",
    [
        "aws-ssm:///team/api-token",
        "aws-ssm://eu-west-1/team/api-token",
        "arn:aws:ssm:us-east-1:123456789012:parameter/team/api-token",
        "aws-secretsmanager:///prod/api#token",
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:prod/api-AbCdEf#token",
        "airflow_conn://wandb/password",
        "airflow_conn://db/extra.api_key",
        "airflow_var://hf_token",
        "{{ var.value.token_ref }}",
    ],
)
def test_aws_and_airflow_references_are_accepted(ref: str) -> None:
    op = make(secret_env={"API_TOKEN": ref}, env={"OTHER": "1"})
    assert op.secret_env == {"API_TOKEN": ref} and "secret_env" in op.template_fields


@pytest.mark.parametrize(
    "ref",
    [
        "gcp-secret://projects/my-proj/secrets/tok",
        "projects/my-proj/secrets/tok/versions/3",
        "airflow_var://t",
    ],
)
def test_gcp_references_are_accepted(ref: str) -> None:
    make(**GCP, secret_env={"API_TOKEN": ref})


def test_templated_env_skips_only_the_overlap_check() -> None:
    make(env="{{ params.env }}", secret_env={"API_TOKEN": "aws-ssm:///team/token"})
    with pytest.raises(ValueError, match="is a GCP secret"):
        make(env="{{ params.env }}", secret_env={"API_TOKEN": "projects/p-1234/secrets/t/versions/1"})


def test_every_operator_of_the_family_takes_secret_env() -> None:
    make(CheckpointResumeOperator, secret_env={"API_TOKEN": "airflow_var://token"})
    with pytest.raises(ValueError, match="Put plain values in env"):
        make(CheckpointResumeOperator, secret_env={"API_TOKEN": "plain"})
    with pytest.raises(ValueError, match="Put plain values in env"):
        make(SpotFleetOperator, cloud="ec2spot", work_items=["a"], secret_env={"API_TOKEN": "plain"})


def test_references_parse_into_what_the_agent_reads() -> None:
    ssm = parse_ref("arn:aws:ssm:eu-west-1:123456789012:parameter/team/tok")
    assert (ssm.scheme, ssm.name, ssm.region) == (AWS_SSM, "/team/tok", "eu-west-1")
    assert parse_ref("aws-ssm:///team/tok") == parse_ref("aws-ssm:///team/tok")
    assert parse_ref("aws-ssm:///team/tok").region == ""
    sm = parse_ref("aws-secretsmanager://us-west-2/prod/db#password")
    assert (sm.scheme, sm.name, sm.region, sm.field) == (
        AWS_SECRETSMANAGER,
        "prod/db",
        "us-west-2",
        "password",
    )
    gcp = parse_ref("gcp-secret://projects/p-1234/secrets/tok")
    assert (gcp.scheme, gcp.name) == (GCP_SECRET, "projects/p-1234/secrets/tok/versions/latest")
    conn = parse_ref("airflow_conn://wandb/password")
    assert (conn.scheme, conn.name, conn.field, conn.by_operator) == (AIRFLOW_CONN, "wandb", "password", True)


def test_the_log_streamer_redacts_secret_values() -> None:
    from airflow_cloudtrain.agent.logs import LogStreamer
    from airflow_cloudtrain.contract.secret_refs import redactions

    class Folder:
        def __init__(self) -> None:
            self.objects: dict[str, bytes] = {}

        def put_bytes(self, key: str, data: bytes) -> None:
            self.objects[key] = data

    class Echo:
        data = b""

        def write(self, data: bytes) -> None:
            self.data += data

        def flush(self) -> None:
            pass

    folder, echo = Folder(), Echo()
    streamer = LogStreamer(folder, "i-1", echo=echo)
    streamer.redact(redactions(["tok-123-secret", "-----BEGIN KEY-----\nAAAABBBB\n-----END KEY-----"]))
    streamer.write(b"token is tok-123-secret\nkey:\n-----BEGIN KEY-----\nAAAABBBB\n-----END KEY-----\n")
    streamer.flush(final=True)
    stored = b"".join(folder.objects.values())
    assert b"tok-123-secret" not in stored and b"AAAABBBB" not in stored and b"token is ***" in stored
    assert b"tok-123-secret" not in echo.data
    assert b"***" in streamer.snapshot()[2].encode()
