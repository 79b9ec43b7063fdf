"""The provider face: what the Airflow side asks of a cloud provider besides a run's backend.

``clouds.registry.provider(name)`` (or ``provider_for_cloud`` / ``provider_for_uri``) returns the one
object per provider (``clouds.aws.provider.AWS``, ``clouds.gcp.provider.GCP``) that satisfies
``Provider``: the run backend for a connection and region, a ``Cloud`` for direct instance calls, the
shared instance pollers of the triggerer, and the live index's bucket. Nobody outside the registry and
the per-provider modules branches on the provider or the URI scheme; they ask the face instead.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.cloud import Cloud, Instance


class InstancePoller(Protocol):
    """One shared poll group's describe calls (blocking: called in worker threads), one SDK client."""

    def describe(self, ids: list[str]) -> dict[str, Instance]: ...

    def close(self) -> None: ...


class LiveStore(Protocol):
    """One bucket seen through one storage client, with what a listing says of each object: the live
    index's reads (``triggers.run_index``). Keys are full object keys."""

    def listing(self, prefix: str) -> list[tuple[str, str | None, float | None]]:
        """(key under ``prefix``, tag (ETag / md5), modified) for every object, a page per 1,000."""
        ...

    def read(self, key: str) -> bytes | None:
        """The object, or None when there is none."""
        ...

    def put(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None:
        """Delete; an object already gone is done."""

    def close(self) -> None: ...


class Provider(Protocol):
    """One cloud provider's face on the Airflow side."""

    name: str  # "aws" | "gcp"
    scheme: str  # its object store's URI scheme: "s3" | "gs"

    def conn(self, conn_id: str | None) -> str | None:
        """The connection a client of this provider is built from (``None``: the provider's default)."""
        ...

    def backend(self, conn_id: str | None, region: str | None, project_id: str | None) -> RunBackend: ...

    def instance_cloud(
        self, conn_id: str | None, region: str | None, zone: str | None, project_id: str | None
    ) -> Cloud:
        """Direct instance calls (the sensor): EC2 in a region, GCE in a zone or a region's zones."""
        ...

    def poll_key(
        self, conn_id: str | None, location: str | None, project_id: str | None, ended_only: bool
    ) -> tuple[Hashable, ...]:
        """The shared poll group of a wait on instances in ``location`` (EC2 region, GCE zone); its
        first item is the provider's name. ``ended_only``: only stopped / ended instances matter."""
        ...

    def instance_poller(self, key: tuple[Hashable, ...]) -> InstancePoller:
        """The poller for a group ``poll_key`` made (built lazily: this runs on the event loop)."""
        ...

    def live_store(self, conn_id: str | None, project_id: str | None, bucket: str) -> LiveStore:
        """The live index's bucket through a new client of the connection (blocking)."""
        ...
