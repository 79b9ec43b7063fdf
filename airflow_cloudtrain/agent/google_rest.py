"""A Google API reached as plain REST from the instance: the agent's calls that need no generated
client (Secret Manager's ``access``, a managed instance group's ``deleteInstances``)."""

from __future__ import annotations

from typing import Any

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def google_session(endpoint: str | None, api_url: str) -> tuple[Any, str]:
    """(a requests session, the base URL) for one Google API: at ``endpoint`` (the emulator's, which
    the emulated VMs get in their environment) without credentials, else at ``api_url`` with the VM's
    service account (ADC, ``cloud-platform`` scope) through google-auth's ``AuthorizedSession``."""
    if endpoint:
        import requests

        return requests.Session(), endpoint.rstrip("/")
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    return AuthorizedSession(credentials), api_url
