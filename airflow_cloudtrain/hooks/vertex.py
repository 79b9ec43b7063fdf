"""Vertex AI custom jobs and their Cloud Logging entries, through the Airflow Google connection.

The job calls use google-cloud-aiplatform's ``JobServiceClient`` over REST (the same HTTP stack as every
other Google API we call, and the transport a local emulator can serve); it is imported when first
used, never at module import: its cold import costs seconds and DAG files must not pay it. Cloud
Logging is read with an authorized ``requests`` session, ``POST /v2/entries:list``: google-cloud-logging
ships no REST transport for its GAPIC client (gRPC only), and gRPC would be a second network stack for
one call. Connection extras ``vertex_endpoint`` and ``logging_endpoint`` serve private or local endpoints
(a Private Service Connect address, the emulator); without them the regional Vertex endpoint
(``<region>-aiplatform.googleapis.com``) and ``logging.googleapis.com`` are used.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

LOGGING_URL = "https://logging.googleapis.com"
TIMEOUT_S = 60.0  # per HTTP call: a hung call must not hold a poll forever


class VertexHook(CloudTrainGcpHook):
    """Job and logging clients for one Google connection (and project).

    :param gcp_conn_id: the Airflow Google connection (``google_cloud_default`` by default); its
        ``vertex_endpoint`` extra points the clients elsewhere (with ``credentials: "anonymous"``).
    :param project_id: the project (None: the connection's).
    """

    hook_name = "Cloud Train (Vertex AI)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.RLock()
        self._session: Any = None

    def _creds(self) -> Any:
        if self._get_field("credentials") == "anonymous" and self._get_field("vertex_endpoint"):
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        return super()._creds()

    def job_client(self, region: str) -> Any:
        """A ``JobServiceClient`` (REST) for ``region``'s endpoint, or the connection's ``vertex_endpoint``."""
        from google.cloud.aiplatform_v1 import JobServiceClient

        endpoint = self._get_field("vertex_endpoint") or f"{region}-aiplatform.googleapis.com"
        return JobServiceClient(
            transport="rest", credentials=self._creds(), client_options={"api_endpoint": endpoint}
        )

    def session(self) -> Any:
        """An authorized ``requests`` session (built once, shared by the threads of one poll)."""
        with self._lock:
            if self._session is None:
                from google.auth.transport.requests import AuthorizedSession

                self._session = AuthorizedSession(self._creds())
            return self._session

    def list_log_entries(
        self, filter_: str, page_token: str | None = None, page_size: int = 1000, newest_first: bool = False
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of ``entries:list`` in this project: (entries, next page token or None)."""
        base = str(self._get_field("logging_endpoint") or LOGGING_URL).rstrip("/")
        body: dict[str, Any] = {
            "resourceNames": [f"projects/{self.project}"],
            "filter": filter_,
            "orderBy": "timestamp desc" if newest_first else "timestamp asc",
            "pageSize": page_size,
        }
        if page_token:
            body["pageToken"] = page_token
        response = self.session().post(f"{base}/v2/entries:list", json=body, timeout=TIMEOUT_S)
        if response.status_code >= 400:
            from google.api_core.exceptions import from_http_response

            raise from_http_response(response)
        data = response.json() or {}
        return list(data.get("entries") or []), data.get("nextPageToken") or None

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None
