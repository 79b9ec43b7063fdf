"""Our hooks build clients without botocore's "Found endpoint ..." / "Found credentials ..." INFO lines,
and leave the user's own boto3 clients and logging as they were (``contract.botocore_logs``).

The connection has neither keys nor an endpoint, so botocore finds both in the environment and says so
at INFO, as in a task whose connection relies on the instance's role or ``AWS_ENDPOINT_URL``. No request
is sent: building a client is enough.
"""

from __future__ import annotations

import json
import logging

import boto3
import pytest

from airflow_cloudtrain.clouds.aws.ec2 import aws_cloud
from airflow_cloudtrain.contract.botocore_logs import CHATTY_LOGGERS
from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook
from airflow_cloudtrain.hooks.sqs import QueueDepthHook


@pytest.fixture
def bare_connection(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_CT_BARE", json.dumps({"conn_type": "aws"}))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return "ct_bare"


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """INFO from botocore reaches the capture whatever an earlier test in this process set (the agent's
    own ``main`` puts "botocore" at WARNING): else a test here could pass without a line to drop."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="botocore")
    caplog.set_level(logging.INFO, logger="aiobotocore")
    return caplog


def found_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.getMessage().startswith(("Found endpoint", "Found cred"))
    ]


def test_our_hooks_build_clients_without_found_lines(bare_connection: str, caplog) -> None:
    hook = CloudTrainAwsHook(aws_conn_id=bare_connection, region_name="us-east-1")
    hook.client("ec2")
    hook.client("s3")
    aws_cloud(hook)  # SSM and EC2, as a run makes them
    assert hook.conn is not None  # the Amazon provider's own client (``get_client_type``)
    QueueDepthHook(aws_conn_id=bare_connection, region_name="us-east-1").sync_client  # noqa: B018
    assert found_lines(caplog) == []


def test_the_user_s_own_clients_still_log_them(bare_connection: str, caplog) -> None:
    """Nothing global changed: a plain boto3 client, after ours, logs both lines as before, and the
    loggers' levels are the user's."""
    CloudTrainAwsHook(aws_conn_id=bare_connection, region_name="us-east-1").client("ec2")
    boto3.session.Session().client("sqs")
    found = found_lines(caplog)
    assert "Found endpoint for sqs via: environment_global." in found
    assert "Found credentials in environment variables." in found
    assert all(logging.getLogger(name).level == logging.NOTSET for name in CHATTY_LOGGERS)  # not ours to set


def test_a_logger_set_to_debug_keeps_them(bare_connection: str, caplog) -> None:
    """Someone debugging how botocore resolves endpoints sees every line, those of our clients too."""
    with caplog.at_level(logging.DEBUG, logger="botocore.configprovider"):
        CloudTrainAwsHook(aws_conn_id=bare_connection, region_name="us-east-1").client("ec2")
    assert any(line.startswith("Found endpoint for ec2") for line in found_lines(caplog))
