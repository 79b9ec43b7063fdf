"""A moto server on loopback for tests that talk to AWS APIs with the real clients; a fresh bucket
and a metadata server for the tests that run the agent itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from airflow_cloudtrain.emulator.metadata import MetadataServer


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh bucket; the env it is reachable with is inherited by the agent subprocesses."""
    for name, value in {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.bucket = f"ct-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=client.bucket)
    return client


@pytest.fixture(scope="module")
def metadata() -> Iterator[MetadataServer]:
    with MetadataServer() as server:
        yield server
