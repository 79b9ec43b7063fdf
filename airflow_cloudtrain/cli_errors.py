"""One line instead of a traceback when a CLI command lacks credentials, a connection or an endpoint.

``cloudtrain runs show`` and ``cloudtrain jobs ...`` talk to the clouds with the user's credentials
(or the emulator's, next to ``make airflow``). A missing credential is a setup step, not a bug: the
user gets one line naming what to set, and the exit status 2. Any other error keeps its traceback.
"""

from __future__ import annotations

import sys
from typing import Any

ENV_HINT = "next to `make airflow`: source .airflow_home/emulator.env"


def _named(err: BaseException, *names: str) -> bool:
    return any(cls.__name__ in names for cls in type(err).__mro__)


def explain(err: BaseException, args: Any) -> str | None:
    """What to set, for an error that means a missing credential, connection or endpoint; None for
    any other error."""
    text = str(err)
    conn_id = getattr(args, "conn_id", None)
    if _named(err, "NoCredentialsError", "PartialCredentialsError"):
        return (
            "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) "
            f"and AWS_DEFAULT_REGION; {ENV_HINT}"
        )
    if _named(err, "AirflowNotFoundException") and "conn_id" in text:
        name = text.split("`")[1] if text.count("`") >= 2 else conn_id or "google_cloud_default"
        var = f"AIRFLOW_CONN_{name.upper()}"
        return (
            f"the Airflow connection {name!r} is not defined: set {var} (a JSON or URI connection), "
            f"or give --conn-id of one that is, or --project; {ENV_HINT}"
        )
    if _named(err, "DefaultCredentialsError"):
        return (
            "no Google credentials: set GOOGLE_APPLICATION_CREDENTIALS (a service account key file) or run "
            f"`gcloud auth application-default login`; for the emulated GCS set STORAGE_EMULATOR_HOST; {ENV_HINT}"
        )
    if _named(err, "EndpointConnectionError", "ConnectionError", "NewConnectionError", "URLError"):
        return f"cannot reach the cloud's endpoint ({text.splitlines()[0][:200]}): is the emulator running? {ENV_HINT}"
    if _named(err, "ServiceUnavailable", "RetryError") and "Connection refused" in text:
        return f"cannot reach the cloud's endpoint: is the emulator running? {ENV_HINT}"
    return None


def run_command(func: Any, args: Any, prog: str) -> int:
    """``func(args)``; a missing credential or connection is one line on stderr and exit status 2."""
    try:
        return int(func(args))
    except Exception as err:
        line = explain(err, args)
        if line is None:
            raise
        print(f"{prog}: {line}", file=sys.stderr)
        return 2
