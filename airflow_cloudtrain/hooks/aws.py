"""The AWS hook: boto3 clients from the Airflow connection (triggers use them from worker threads).

SDK and connection only: ``clouds.aws.ec2.aws_cloud(hook)`` builds the ``Cloud`` on top of it, and
``clouds.aws.pollers`` the triggerer's pollers."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from botocore.loaders import JSONFileLoader, create_loader

from airflow_cloudtrain.contract.botocore_logs import quiet_botocore

_LOADERS: dict[str | None, Any] = {}  # botocore data path -> this process's loader for it
_LOADERS_LOCK = threading.Lock()


def share_service_models(session: Any) -> Any:
    """Point a new boto3 or aiobotocore session at this process's own botocore loader.

    A boto3 session makes a loader of its own (the Amazon provider shares one only between its async
    sessions), so each client a new session makes parses its service's model again: EC2's is 4 MB
    of JSON, 0.1-0.3 s of CPU, most of a task's CPU against a fast endpoint, and the provider's hooks
    make a session per ``get_session``. The models are read-only data and the loader keeps what it
    loaded, so one parsed copy serves every session with the same data path (``AWS_DATA_PATH`` /
    ``data_path``); two threads' first loads of one model may both parse it, to the same result."""
    core = getattr(session, "_session", session)  # boto3 wraps a botocore session; aiobotocore's is one
    data_path = core.get_config_variable("data_path")
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path)
        if loader is None:
            loader = create_loader(data_path)
            loader.file_loader = PlainJsonFileLoader()
            _LOADERS[data_path] = loader
    core.register_component("data_loader", loader)
    return session


class PlainJsonFileLoader(JSONFileLoader):
    """botocore parses its models into OrderedDicts, through a callback per JSON object: EC2's model
    takes 144 ms instead of 51 ms, all of it holding the interpreter (a triggerer's event loop waits
    that long for the thread that builds a client), and none of them can leave the garbage
    collector's lists, as plain dicts of strings do. Plain dicts keep their order too."""

    def _load_file(self, full_path: str, open_method: Any) -> Any:
        if not os.path.isfile(full_path):
            return None
        with open_method(full_path, "rb") as fp:
            return json.loads(fp.read().decode("utf-8"))


class CloudTrainAwsHook(AwsBaseHook):
    """EC2 + S3 + SSM (and any other service's) clients for one connection and region, as the Amazon
    provider's ``AwsBaseHook`` makes them, sharing parsed service models across sessions.

    :param aws_conn_id: the Airflow AWS connection (``aws_default`` by default).
    :param region_name: the region (None: the connection's).
    :param config: a ``botocore.config.Config`` for the clients (as ``AwsBaseHook``).
    :param verify: TLS verification (as ``AwsBaseHook``).
    """

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Cloud Train (AWS)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "ec2"
        super().__init__(*args, **kwargs)

    def get_session(self, region_name: str | None = None, deferrable: bool = False) -> Any:
        """The connection's session (as the Amazon provider makes it), sharing parsed service models;
        botocore's "Found credentials/endpoint" INFO lines stay out of the task log (``botocore_logs``)."""
        with quiet_botocore():
            return share_service_models(super().get_session(region_name=region_name, deferrable=deferrable))

    def get_client_type(self, *args: Any, **kwargs: Any) -> Any:
        """The Amazon provider's client (``self.conn``), without botocore's "Found ..." INFO lines."""
        with quiet_botocore():
            return super().get_client_type(*args, **kwargs)

    def client(self, service: str, region: str | None = None, config: Any = None) -> Any:
        """A boto3 client for any service, from this connection (credentials, endpoint, config)."""
        with quiet_botocore():
            session = self.get_session(region_name=region or self.conn_region_name)
            return session.client(
                service,
                endpoint_url=self.conn_config.get_service_endpoint_url(service_name=service),
                config=config or self.config,
                verify=self.verify,
            )

    @property
    def conn_region_name(self) -> str:
        return self.region_name or self.conn.meta.region_name

    def s3_client(self) -> Any:
        return self.client("s3")
