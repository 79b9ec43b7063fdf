"""The GCP hook: Compute Engine and Cloud Storage clients from the Google provider's connection.

Credentials and project resolve exactly as the official Google provider resolves them
(``gcp_conn_id``, key file / JSON / ADC, ``project_id``). Two optional connection extras serve
private or local endpoints: ``compute_endpoint`` (e.g. a Private Service Connect address) and
``storage_endpoint``, ``billing_endpoint``, ``pubsub_endpoint``, ``monitoring_endpoint``;
``credentials: "anonymous"`` is accepted only together with a compute endpoint. The Pub/Sub
clients use the REST transport (plain pull is all a work queue needs; streaming pull is gRPC-only),
so one HTTP stack serves every Google API we call.

SDK and connection only: ``clouds.gcp.gce.gcp_cloud(hook, region, zone)`` builds the ``Cloud`` on
top of it, and ``clouds.gcp.pollers`` the triggerer's pollers.

Compute Engine clients come with their reads asked again (``RetryingReads``): a busy project answers
any call with 429 ``rateLimitExceeded``, and a run's sweep lists every zone and kind, so without it
one refusal among a dozen lists failed the whole teardown. botocore does the same for EC2 by default.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

if TYPE_CHECKING:
    from airflow_cloudtrain.storage import RunFolder


# Methods of a Compute client that only read or wait: safe to send again. Mutations are repeated by
# their callers where that is safe (instances.insert carries a request id).
READ_METHODS = frozenset({"get", "list", "aggregated_list", "wait"})
READ_RETRY_S = 120.0  # how long one read rides out throttling and 5xx


@functools.cache
def _read_retry() -> Any:
    from google.api_core import exceptions as gexc
    from google.api_core.retry import Retry, if_exception_type

    transient = (
        gexc.TooManyRequests,
        gexc.ServiceUnavailable,
        gexc.InternalServerError,
        gexc.BadGateway,
        gexc.GatewayTimeout,
    )
    return Retry(predicate=if_exception_type(*transient), initial=0.5, maximum=15.0, timeout=READ_RETRY_S)


class RetryingReads:
    """A Compute client whose reads (``READ_METHODS``) retry throttling and 5xx with backoff, unless
    the caller passes its own ``retry``; everything else is the client's own."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in READ_METHODS and callable(attr):
            return functools.partial(_call_with_read_retry, attr)
        return attr


def _call_with_read_retry(method: Any, *args: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("retry", _read_retry())
    return method(*args, **kwargs)


class CloudTrainGcpHook(GoogleBaseHook):
    """Compute, Storage, Pub/Sub (and, through ``_client_kwargs``, any other Google API's) clients for
    one Google connection, resolved as the Google provider's ``GoogleBaseHook`` resolves it.

    :param gcp_conn_id: the Airflow Google connection (``google_cloud_default`` by default).
    :param project_id: the project (None: the connection's ``project``, then the credentials').
    :param impersonation_chain: as ``GoogleBaseHook`` (passed on with any other keyword).
    """

    conn_name_attr = "gcp_conn_id"
    default_conn_name = "google_cloud_default"
    conn_type = "google_cloud_platform"
    hook_name = "Cloud Train (GCP)"

    def __init__(
        self, gcp_conn_id: str = "google_cloud_default", project_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(gcp_conn_id=gcp_conn_id, **kwargs)
        self._project_override = project_id

    @property
    def project(self) -> str:
        # the connection's own project first: resolving ADC only to learn the project is slow (and
        # impossible with anonymous credentials)
        project = self._project_override or self._get_field("project") or self.project_id
        if not project:
            raise ValueError(f"no project: set project_id= or the project of connection {self.gcp_conn_id!r}")
        return project

    def _creds(self) -> Any:
        if self._get_field("credentials") == "anonymous" and self._get_field("compute_endpoint"):
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        return self.get_credentials()

    def _client_kwargs(self, field: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"credentials": self._creds()}
        if endpoint := self._get_field(field):
            kwargs["client_options"] = {"api_endpoint": endpoint}
        return kwargs

    def compute_client(self, name: str) -> Any:
        """``google.cloud.compute_v1.<name>`` (e.g. ``"FirewallsClient"``) for this connection, its
        reads retried (``RetryingReads``)."""
        from google.cloud import compute_v1

        return RetryingReads(getattr(compute_v1, name)(**self._client_kwargs("compute_endpoint")))

    def instances_client(self) -> Any:
        return self.compute_client("InstancesClient")

    def operations_client(self) -> Any:
        return self.compute_client("ZoneOperationsClient")

    def templates_client(self) -> Any:
        return self.compute_client("InstanceTemplatesClient")

    def groups_client(self) -> Any:
        return self.compute_client("InstanceGroupManagersClient")

    def publisher_client(self) -> Any:
        from google.pubsub_v1 import PublisherClient

        return PublisherClient(transport="rest", **self._client_kwargs("pubsub_endpoint"))

    def subscriber_client(self) -> Any:
        from google.pubsub_v1 import SubscriberClient

        return SubscriberClient(transport="rest", **self._client_kwargs("pubsub_endpoint"))

    def storage_client(self) -> Any:
        from google.cloud.storage import Client

        from airflow_cloudtrain.storage import without_bucket_lookups

        return without_bucket_lookups(Client(project=self.project, **self._client_kwargs("storage_endpoint")))

    def run_folder(self, run_uri: str) -> RunFolder:
        from airflow_cloudtrain.storage import open_run_folder

        return open_run_folder(run_uri, gcs_client=self.storage_client())
