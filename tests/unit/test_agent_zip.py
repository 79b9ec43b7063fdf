"""The agent zip imports with the stdlib and boto3 only: never Airflow, never the provider's other
modules. The zip is extracted and imported by a fresh interpreter whose only copy of
``airflow_cloudtrain`` is the extracted one; ``airflow`` imports are made to fail, so an import of
Airflow anywhere in the agent (or in ``runs`` / ``clouds.registry``, which it ships) shows."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from airflow_cloudtrain.contract import clouds as registry
from airflow_cloudtrain.contract.bootstrap import build_agent_zip

AGENT_MODULES = [
    "airflow_cloudtrain.agent.cli",
    "airflow_cloudtrain.agent.runner",
    "airflow_cloudtrain.agent.watcher",
    "airflow_cloudtrain.storage",
    "airflow_cloudtrain.contract.retry",
    "airflow_cloudtrain.contract.bootstrap",
    "airflow_cloudtrain.agent.checkpoints",
    "airflow_cloudtrain.checkpoint",
]

# Runs in the child: imports the agent, then reports what got imported and from where.
PROBE = r"""
import importlib, json, sys

class NoAirflow:
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError(f"the agent imported {name}")
        return None

sys.meta_path.insert(0, NoAirflow())
for name in MODULES:
    importlib.import_module(name)
from airflow_cloudtrain.agent import watcher
if WITH_SDK:
    from airflow_cloudtrain.storage import s3_client
    s3_client()  # boto3 imported and a client built, still without Airflow
loaded = {n: getattr(m, "__file__", None) for n, m in sys.modules.items()
          if n.split(".")[0] in ("airflow", "airflow_cloudtrain")}
by_metadata = {kind: sorted(c for c, p in watcher.CLOUDS.items() if watcher.METADATA[p] is cls)
               for kind, cls in (("aws", watcher.AwsMetadata), ("gcp", watcher.GceMetadata))}
print(json.dumps({"loaded": loaded, **by_metadata, "sdk": "boto3" in sys.modules}))
"""


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("agent-zip")
    with zipfile.ZipFile(io.BytesIO(build_agent_zip())) as archive:
        archive.extractall(dest)
    return dest


def _probe(extracted: Path, *flags: str, with_sdk: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(extracted), AWS_DEFAULT_REGION="us-east-1")
    code = f"MODULES = {AGENT_MODULES!r}\nWITH_SDK = {with_sdk!r}\n" + PROBE
    done = subprocess.run(
        [sys.executable, *flags, "-c", code],
        cwd=extracted,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _assert_only_the_zip(result: dict, extracted: Path) -> None:
    loaded = result["loaded"]
    assert not [n for n in loaded if n == "airflow" or n.startswith("airflow.")]
    for name, path in loaded.items():
        assert path is None or Path(path).is_relative_to(extracted), (name, path)
    assert "airflow_cloudtrain.contract.clouds" in loaded and "airflow_cloudtrain.checkpoint" in loaded
    assert not {"airflow_cloudtrain.clouds.aws.ec2", "airflow_cloudtrain.core.cloud"} & set(loaded)
    assert result["aws"] == sorted(registry.AWS_CLOUDS) and result["gcp"] == sorted(registry.GCP_CLOUDS)


def test_agent_zip_imports_with_the_stdlib_alone(extracted: Path) -> None:
    """``-S``: no site-packages at all, so neither boto3 nor the installed provider can be found."""
    result = _probe(extracted, "-S", with_sdk=False)
    _assert_only_the_zip(result, extracted)
    assert not result["sdk"]  # the SDK is imported lazily, when a run folder is opened


def test_agent_zip_imports_with_boto3_and_no_airflow(extracted: Path) -> None:
    """With site-packages (boto3 there, Airflow there too but refused), the zip's modules win."""
    result = _probe(extracted, with_sdk=True)
    _assert_only_the_zip(result, extracted)
    assert result["sdk"]


def test_agent_zip_ships_the_contract_floor_whole() -> None:
    """The contract floor, storage and the agent, byte for byte; no other part of the provider."""
    package = Path(registry.__file__).resolve().parent.parent
    with zipfile.ZipFile(io.BytesIO(build_agent_zip())) as archive:
        names = set(archive.namelist())
        shipped = {n: archive.read(n) for n in names if n.startswith("airflow_cloudtrain/")}
    contract = {f"airflow_cloudtrain/contract/{p.name}" for p in (package / "contract").glob("*.py")}
    assert contract <= names and "airflow_cloudtrain/contract/__init__.py" in contract
    assert {"airflow_cloudtrain/checkpoint.py", "airflow_cloudtrain/agent/checkpoints.py"} <= names
    assert "airflow_cloudtrain/storage.py" in names
    tops = {n.split("/")[1] for n in names if n.startswith("airflow_cloudtrain/")}
    assert tops == {"__init__.py", "checkpoint.py", "storage.py", "transfer.py", "contract", "agent"}
    for name, data in shipped.items():
        assert data == (package.parent / name).read_bytes(), name
