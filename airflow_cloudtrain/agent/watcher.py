"""The instance metadata services, seen from the agent: who am I, and is the cloud taking me back?

AWS announces a spot interruption about two minutes ahead in IMDS (``spot/instance-action``); GCE
flips ``instance/preempted`` to TRUE about 30 s ahead and announces host maintenance that terminates
the VM in ``instance/maintenance-event``. Polling these is the only warning a job gets to checkpoint.
The endpoints come from the standard variables (``AWS_EC2_METADATA_SERVICE_ENDPOINT`` as botocore
reads it, ``GCE_METADATA_HOST`` as google-auth reads it), which is how the emulator points the agent
at its local metadata server without the agent knowing. Which cloud name is which provider comes
from ``airflow_cloudtrain.contract.clouds`` (shipped in the agent zip), the one list of names.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow_cloudtrain.contract.clouds import CLOUDS

# Proxies must never see metadata requests (real IMDS is link-local; a proxy would answer for itself).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Notice:
    """An announced interruption; ``at`` is when the cloud acts (unix time) when it said so."""

    kind: str  # "spot" | "preemption"
    action: str
    notice_at: float
    at: float | None = None

    def interruption(self) -> dict[str, Any]:
        """The ``RunStatus.interruption`` record."""
        record: dict[str, Any] = {"kind": self.kind, "notice_at": self.notice_at, "action": self.action}
        if self.at is not None:
            record["at"] = self.at
        return record


def _request(url: str, headers: dict[str, str], method: str = "GET", timeout: float = 2.0) -> str | None:
    """Body of a metadata request, None on 404; other HTTP errors raise."""
    req = urllib.request.Request(url, headers=headers, method=method, data=b"" if method == "PUT" else None)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


def parse_time(text: str) -> float | None:
    """``2026-11-22T03:10:00Z`` -> unix time; None when unparsable (the notice still counts)."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
    except (ValueError, AttributeError):
        return None


class AwsMetadata:
    """IMDSv2: a session token first, then GETs carrying it (instances launch with tokens required)."""

    TTL = 21600

    def __init__(self, base: str | None = None, timeout: float = 2.0) -> None:
        base = base or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or "http://169.254.169.254"
        self.base = base.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None
        self._token_expires = 0.0

    def _get_token(self, refresh: bool = False) -> str:
        if refresh or self._token is None or time.time() > self._token_expires:
            headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TTL)}
            token = _request(f"{self.base}/latest/api/token", headers, "PUT", self.timeout)
            if not token:
                raise RuntimeError("IMDS returned no session token")
            self._token, self._token_expires = token, time.time() + self.TTL - 60
        return self._token

    def get(self, path: str) -> str | None:
        url = f"{self.base}/latest/meta-data/{path}"
        try:
            return _request(url, {"X-aws-ec2-metadata-token": self._get_token()}, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            if err.code != 401:
                raise
            return _request(url, {"X-aws-ec2-metadata-token": self._get_token(True)}, timeout=self.timeout)

    def instance_id(self) -> str:
        value = self.get("instance-id")
        if not value:
            raise RuntimeError("IMDS has no instance-id")
        return value.strip()

    def poll(self) -> Notice | None:
        body = self.get("spot/instance-action")
        if body is None:
            return None
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            data = {}
        return Notice(
            "spot", str(data.get("action") or "terminate"), time.time(), parse_time(data.get("time", ""))
        )


class GceMetadata:
    """The GCE metadata server: plain GETs with ``Metadata-Flavor: Google``."""

    def __init__(self, host: str | None = None, timeout: float = 2.0) -> None:
        host = host or os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
        self.base = ("http://" + host).rstrip("/")
        self.timeout = timeout

    def get(self, path: str) -> str | None:
        url = f"{self.base}/computeMetadata/v1/instance/{path}"
        return _request(url, {"Metadata-Flavor": "Google"}, timeout=self.timeout)

    def instance_id(self) -> str:
        value = self.get("name")
        if not value:
            raise RuntimeError("the GCE metadata server has no instance name")
        return value.strip()

    def poll(self) -> Notice | None:
        if (self.get("preempted") or "").strip().upper() == "TRUE":
            return Notice("preemption", "preempted", time.time())
        event = (self.get("maintenance-event") or "NONE").strip().upper()
        if event.startswith("TERMINATE"):  # MIGRATE_ON_HOST_MAINTENANCE is a live migration: harmless
            return Notice("preemption", event, time.time())
        return None


# The agent's own per-provider tables (it may import only the contract, storage and itself).
METADATA: dict[str, type[AwsMetadata] | type[GceMetadata]] = {"aws": AwsMetadata, "gcp": GceMetadata}
# the cloud a run folder's URI scheme stands for when the spec could not be read (who am I, still)
FOLDER_CLOUD: dict[str, str] = {"s3": "ec2", "gs": "gcloud"}


def metadata_for(cloud: str) -> AwsMetadata | GceMetadata:
    """The metadata client for a cloud name of the spec (``ec2``, ``ec2spot``, ``gcloud``, ``gcspot``)."""
    if cloud not in CLOUDS:
        raise ValueError(f"unknown cloud {cloud!r}; expected one of {sorted(CLOUDS)}")
    return METADATA[CLOUDS[cloud]]()
