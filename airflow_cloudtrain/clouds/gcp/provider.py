"""GCP's provider face (``core.provider.Provider``): what the registry hands out for ``gcloud`` /
``gcspot`` runs and for ``gs://`` buckets."""

from __future__ import annotations

from collections.abc import Hashable

from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend
from airflow_cloudtrain.clouds.gcp.gce import GcpCloud, gcp_cloud
from airflow_cloudtrain.clouds.gcp.pollers import GcePoller, GcsLiveStore
from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

DEFAULT_CONN = "google_cloud_default"


class GcpProvider:
    """Compute Engine per zone, Cloud Storage, Secret Manager; the connection is ``gcp_conn_id``
    (None: ``google_cloud_default``) and the project ``project_id`` (None: the connection's)."""

    name = "gcp"
    scheme = "gs"

    def conn(self, conn_id: str | None) -> str | None:
        return conn_id or DEFAULT_CONN

    def backend(self, conn_id: str | None, region: str | None, project_id: str | None) -> GcpRunBackend:
        return GcpRunBackend(conn_id or DEFAULT_CONN, project_id, region)

    def instance_cloud(
        self, conn_id: str | None, region: str | None, zone: str | None, project_id: str | None
    ) -> GcpCloud:
        hook = CloudTrainGcpHook(gcp_conn_id=conn_id or DEFAULT_CONN, project_id=project_id)
        return gcp_cloud(hook, region, zone)

    def poll_key(
        self, conn_id: str | None, location: str | None, project_id: str | None, ended_only: bool
    ) -> tuple[Hashable, ...]:
        return (self.name, conn_id, project_id, location)  # GCE lists the zone: every state at no extra cost

    def instance_poller(self, key: tuple[Hashable, ...]) -> GcePoller:
        _, conn_id, project_id, zone = key
        return GcePoller(_opt_str(conn_id), _opt_str(project_id), _opt_str(zone))

    def live_store(self, conn_id: str | None, project_id: str | None, bucket: str) -> GcsLiveStore:
        return GcsLiveStore(conn_id, project_id, bucket)


def _opt_str(value: Hashable) -> str | None:
    return None if value is None else str(value)


GCP = GcpProvider()
