"""Test-wide settings: an isolated AIRFLOW_HOME and catalog cache, set before Airflow is imported."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_HOME = Path(tempfile.mkdtemp(prefix="cloudtrain-tests-"))
os.environ.setdefault("AIRFLOW_HOME", str(_HOME / "airflow"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ["CLOUDTRAIN_CACHE_DIR"] = str(_HOME / "cache")
for _var in (
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
):
    os.environ.pop(_var, None)
