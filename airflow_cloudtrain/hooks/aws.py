"""The AWS hook: boto3 clients from the Airflow connection (triggers use them from worker threads).

SDK and connection only: ``clouds.aws.ec2.aws_cloud(hook)`` builds the ``Cloud`` on top of it, and
``clouds.aws.pollers`` the triggerer's pollers."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_cloudtrain.contract.botocore_logs import quiet_botocore
from airflow_cloudtrain.storage import share_service_models


def _outer_frames() -> Iterator[FrameType]:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


class CallerFromFrames:
    """The Amazon provider's search for the operator (or executor) that made a client, for the
    user agent's ``Caller/...``, without ``inspect.stack()``.

    The provider walks ``inspect.stack()`` twice per client it makes (``_get_config``), and that reads
    the source line of every frame on the stack and maps each frame to its module through every loaded
    module: 20-70 ms of CPU per client in a task's deep stack, only to read frame names and ``self``.
    The frames themselves answer the same question: the same name, the same class, the same order
    (innermost first)."""

    @staticmethod
    def _find_operator_class_name(target_function_name: str) -> str | None:
        for frame in _outer_frames():
            if frame.f_code.co_name == target_function_name:
                return type(frame.f_locals["self"]).__name__  # KeyError: "Unknown", as the provider's
        return None

    @staticmethod
    def _find_executor_class_name() -> str | None:
        for frame in _outer_frames():
            classes = [name for name, obj in frame.f_globals.items() if isinstance(obj, type)]
            if "BaseExecutor" in classes:
                return classes[-1]
        return None


class CloudTrainAwsHook(CallerFromFrames, AwsBaseHook):
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
        # (service, region, config) -> client: a client costs a session and 20-50 ms of CPU, and the
        # ledger's find/delete of a fleet's queues, templates and groups asks for three each time;
        # boto3's clients are thread-safe, and a refreshed credential reaches them through the session
        self._clients: dict[tuple[str, str | None, Any], Any] = {}
        self._clients_lock = threading.Lock()

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
        """A boto3 client for any service, from this connection (credentials, endpoint, config); one
        per service, region and config for the hook's life."""
        # a Config made anew per call (``aws_cloud``'s no-retries one) is the same config by its options
        options = getattr(config, "_user_provided_options", None)
        key = (service, region, config if options is None else repr(sorted(options.items())))
        with self._clients_lock:
            made = self._clients.get(key)
            if made is None:
                with quiet_botocore():
                    session = self.get_session(region_name=region or self.conn_region_name)
                    made = session.client(
                        service,
                        endpoint_url=self.conn_config.get_service_endpoint_url(service_name=service),
                        config=config or self.config,
                        verify=self.verify,
                    )
                self._clients[key] = made
        return made

    @property
    def conn_region_name(self) -> str:
        return self.region_name or self.conn.meta.region_name

    def s3_client(self) -> Any:
        return self.client("s3")
