"""What the triggerer polls on GCP, one SDK client per shared poll group: GCE instances and the live
index's Cloud Storage bucket (``core.provider``: ``InstancePoller``, ``LiveStore``)."""

from __future__ import annotations

import contextlib
from typing import Any

from airflow_cloudtrain.clouds.gcp.gce import GcpCloud, gcp_cloud
from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook


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
            self._cloud = gcp_cloud(hook, None, self.zone)
        return self._cloud.describe(ids)

    def close(self) -> None:
        cloud, self._cloud = self._cloud, None
        for client in (getattr(cloud, "instances", None), getattr(cloud, "operations", None)):
            transport = getattr(client, "transport", None)
            if transport is not None and hasattr(transport, "close"):
                transport.close()


class GcsLiveStore:
    """One Cloud Storage bucket through one client of the connection (the live index's reads); a
    listing asks only for the fields it uses."""

    def __init__(self, conn_id: str | None, project_id: str | None, bucket: str) -> None:
        self.bucket = bucket
        hook = CloudTrainGcpHook(gcp_conn_id=conn_id or "google_cloud_default", project_id=project_id)
        self.client: Any = hook.storage_client()

    def listing(self, prefix: str) -> list[tuple[str, str | None, float | None]]:
        out: list[tuple[str, str | None, float | None]] = []
        blobs = self.client.list_blobs(
            self.bucket, prefix=prefix, fields="items(name,md5Hash,updated),nextPageToken"
        )
        for blob in blobs:
            updated = blob.updated.timestamp() if blob.updated else None
            out.append((blob.name[len(prefix) :], blob.md5_hash, updated))
        return out

    def read(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self.client.bucket(self.bucket).blob(key).download_as_bytes())
        except NotFound:
            return None

    def put(self, key: str, data: bytes) -> None:
        self.client.bucket(self.bucket).blob(key).upload_from_string(data)

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound):
            self.client.bucket(self.bucket).blob(key).delete()

    def close(self) -> None:
        if hasattr(self.client, "close"):
            self.client.close()
