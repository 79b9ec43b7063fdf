"""The GCP hook: Compute Engine and Cloud Storage clients from the Google provider's connection.

Credentials and project resolve exactly as the official Google provider resolves them
(``gcp_conn_id``, key file / JSON / ADC, ``project_id``). Two optional connection extras serve
private or local endpoints: ``compute_endpoint`` (e.g. a Private Service Connect address) and
``storage_endpoint``, ``billing_endpoint``, ``pubsub_endpoint``, ``monitoring_endpoint``;
``credentials: "anonymous"`` is accepted only together with a compute endpoint. The Pub/Sub
clients use the REST transport (plain pull is all a work queue needs; streaming pull is gRPC-only),
so one HTTP stack serves every Google API we call.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

from airflow_cloudtrain.clouds.gcp.gce import GcpCloud
from airflow_cloudtrain.core.cloud import Instance


class CloudTrainGcpHook(GoogleBaseHook):
    """Compute + Storage clients for one Google connection."""

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

    def instances_client(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.InstancesClient(**self._client_kwargs("compute_endpoint"))

    def operations_client(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.ZoneOperationsClient(**self._client_kwargs("compute_endpoint"))

    def templates_client(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.InstanceTemplatesClient(**self._client_kwargs("compute_endpoint"))

    def groups_client(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.InstanceGroupManagersClient(**self._client_kwargs("compute_endpoint"))

    def publisher_client(self) -> Any:
        from google.pubsub_v1 import PublisherClient

        return PublisherClient(transport="rest", **self._client_kwargs("pubsub_endpoint"))

    def subscriber_client(self) -> Any:
        from google.pubsub_v1 import SubscriberClient

        return SubscriberClient(transport="rest", **self._client_kwargs("pubsub_endpoint"))

    def storage_client(self) -> Any:
        from google.cloud import storage

        return storage.Client(project=self.project, **self._client_kwargs("storage_endpoint"))

    def cloud(self, region: str | None, zone: str | None = None) -> GcpCloud:
        zones = [zone] if zone else zones_of(region)
        return GcpCloud(
            self.instances_client(),
            self.operations_client(),
            self.project,
            region or (zone or "").rsplit("-", 1)[0],
            zones,
        )

    def run_folder(self, run_uri: str) -> Any:
        from airflow_cloudtrain.storage import open_run_folder

        return open_run_folder(run_uri, gcs_client=self.storage_client())


class GcePoller:
    """The GCE side of one shared poll group: one Compute client (built in a worker thread on first
    use), one ``instances.list`` per zone per poll, closed when the group ends."""

    def __init__(self, conn_id: str | None, project_id: str | None, zone: str | None) -> None:
        self.conn_id = conn_id or "google_cloud_default"
        self.project_id = project_id
        self.zone = zone
        self._cloud: GcpCloud | None = None

    def describe(self, ids: list[str]) -> dict[str, Instance]:
        if self._cloud is None:
            hook = CloudTrainGcpHook(gcp_conn_id=self.conn_id, project_id=self.project_id)
            self._cloud = hook.cloud(None, self.zone)
        return self._cloud.describe(ids)

    def close(self) -> None:
        cloud, self._cloud = self._cloud, None
        for client in (getattr(cloud, "instances", None), getattr(cloud, "operations", None)):
            transport = getattr(client, "transport", None)
            if transport is not None and hasattr(transport, "close"):
                transport.close()


def zones_of(region: str | None) -> list[str]:
    """The region's zones the catalog knows (where our machine types are offered)."""
    from airflow_cloudtrain.catalog.snapshot import snapshot_rows

    if not region:
        raise ValueError("a GCE region or zone is needed")
    zones = sorted({z for r in snapshot_rows("gcp") if r.region == region for z in r.zones})
    return zones or [f"{region}-a", f"{region}-b", f"{region}-c"]
