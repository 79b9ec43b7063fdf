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

from airflow_cloudtrain.agent.bootstrap import build_agent_zip
from airflow_cloudtrain.clouds import registry

AGENT_MODULES = [
    "airflow_cloudtrain.agent.cli",
    "airflow_cloudtrain.agent.runner",
    "airflow_cloudtrain.agent.watcher",
    "airflow_cloudtrain.agent.storage",
    "airflow_cloudtrain.agent.retry",
    "airflow_cloudtrain.agent.bootstrap",
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
    from airflow_cloudtrain.agent.storage import s3_client
    s3_client()  # boto3 imported and a client built, still without Airflow
loaded = {n: getattr(m, "__file__", None) for n, m in sys.modules.items()
          if n.split(".")[0] in ("airflow", "airflow_cloudtrain")}
print(json.dumps({"loaded": loaded, "aws": sorted(watcher.AWS_CLOUDS), "gcp": sorted(watcher.GCP_CLOUDS),
                  "sdk": "boto3" in sys.modules}))
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
    assert "airflow_cloudtrain.clouds.registry" in loaded and "airflow_cloudtrain.checkpoint" in loaded
    assert not {"airflow_cloudtrain.clouds.aws", "airflow_cloudtrain.clouds.base"} & set(loaded)
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


def test_agent_zip_ships_the_registry_and_stub_packages() -> None:
    with zipfile.ZipFile(io.BytesIO(build_agent_zip())) as archive:
        names = set(archive.namelist())
        clouds_init = archive.read("airflow_cloudtrain/clouds/__init__.py").decode()
        shipped = archive.read("airflow_cloudtrain/clouds/registry.py")
    assert {"airflow_cloudtrain/clouds/__init__.py", "airflow_cloudtrain/clouds/registry.py"} <= names
    assert "airflow_cloudtrain/agent/retry.py" in names
    assert {"airflow_cloudtrain/checkpoint.py", "airflow_cloudtrain/agent/checkpoints.py"} <= names
    assert not [
        n
        for n in names
        if n.startswith("airflow_cloudtrain/clouds/")
        and "registry" not in n
        and not n.endswith("__init__.py")
    ]
    assert "import" not in clouds_init  # a stub: the real package docstring's modules stay behind
    assert shipped == Path(registry.__file__).read_bytes()
