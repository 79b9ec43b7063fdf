"""Which API calls reached the emulated clouds, and from which side: what the permission documents
(``airflow_cloudtrain.permissions``) are generated from and checked against.

Two sides need different permissions in production: the Airflow side (operators, hooks, triggers: the
``aws_default`` / ``google_cloud_default`` connections' identity) and the instance side (the agent
and the job: the EC2 instance profile, the GCE VM's or Vertex AI job's service account). The emulator
tells them apart by how each reaches it, without any change to the code under test:

* AWS: by the access key in the SigV4 credential scope. The emulator's ``aws_default`` connection
  signs with ``AIRFLOW_ACCESS_KEY``, its instances' agents get ``INSTANCE_ACCESS_KEY`` in their
  environment (as a real instance gets its profile's keys from the metadata service); anything else
  (a test's own boto3 client, the process-wide ``testing`` key) is ``other``.
* Google: by the ``Host`` the client addressed. The instances' and Vertex AI replicas' endpoints name
  ``INSTANCE_HOST`` (``localhost``), everything else ``127.0.0.1``: the Airflow side (a test's own
  Google clients, which use the same endpoints, are counted there too).

Recording is a set insert under a lock per request (distinct ``Call``s only), always on; ``take()``
hands the calls seen since the last ``take()`` and forgets them (``tests/api_calls_hook.py`` does,
around each test).
"""

from __future__ import annotations

import re
import threading
from typing import NamedTuple

AIRFLOW_ACCESS_KEY = "AKIACTAIRFLOWSIDE"  # the emulator's aws_default connection
INSTANCE_ACCESS_KEY = "AKIACTINSTANCESIDE"  # its instances' agents (the instance profile)
INSTANCE_HOST = "localhost"  # the Google endpoints as the instances and replicas address them

_KEY = re.compile(r"Credential=([^/,\s]+)/")


class Call(NamedTuple):
    provider: str  # "aws" / "gcp"
    side: str  # "airflow" / "instance" / "other"
    service: str  # AWS signing name ("ec2", "s3", "sqs") / Google service ("compute", "storage")
    operation: str  # "RunInstances", "GetObject" / "instances.insert", "objects.get"


_lock = threading.Lock()
_seen: set[Call] = set()


def aws_side(authorization: str, query: str = "") -> str:
    """The side of a SigV4-signed request, from its access key (header, or a presigned URL's query)."""
    found = _KEY.search(authorization) or _KEY.search(query.replace("%2F", "/"))
    key = found.group(1) if found else ""
    return {AIRFLOW_ACCESS_KEY: "airflow", INSTANCE_ACCESS_KEY: "instance"}.get(key, "other")


def google_side(host: str | None) -> str:
    """The side of a Google API request, from the host its client addressed."""
    return "instance" if (host or "").split(":")[0] == INSTANCE_HOST else "airflow"


def instance_url(endpoint: str) -> str:
    """An emulated Google endpoint as the instances' side addresses it (same server)."""
    return endpoint.replace("127.0.0.1", INSTANCE_HOST, 1)


def record(provider: str, side: str, service: str, operation: str) -> None:
    call = Call(provider, side, service, operation)
    if call in _seen:  # the common case: no lock
        return
    with _lock:
        _seen.add(call)


def take() -> set[Call]:
    """The distinct calls since the last ``take()``; forgets them."""
    with _lock:
        out = set(_seen)
        _seen.clear()
    return out
