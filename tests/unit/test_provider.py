"""Airflow finds the provider through its entry point, and DAG parsing stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import airflow_cloudtrain


def test_providers_manager_lists_us_with_version() -> None:
    from airflow.providers_manager import ProvidersManager

    providers = ProvidersManager().providers
    assert "airflow-cloudtrain" in providers
    assert providers["airflow-cloudtrain"].version == airflow_cloudtrain.__version__


def test_every_registered_module_imports() -> None:
    import importlib

    info = airflow_cloudtrain.get_provider_info()
    modules = [
        m
        for kind in ("operators", "sensors", "hooks", "triggers")
        for entry in info[kind]
        for m in entry["python-modules"]
    ]
    assert "airflow_cloudtrain.operators.cloud_train" in modules
    assert "airflow_cloudtrain.operators.checkpoint_resume" in modules
    for module in modules:
        importlib.import_module(module)


PUBLIC_MODULES = [
    "airflow_cloudtrain",
    "airflow_cloudtrain.spec",
    "airflow_cloudtrain.catalog",
    "airflow_cloudtrain.operators",
    "airflow_cloudtrain.sensors",
]


def test_importing_public_modules_loads_no_cloud_sdk() -> None:
    code = (
        "import importlib, json, sys\n"
        "before = set(sys.modules)  # a .pth file pre-creates the empty google.cloud namespace\n"
        f"for m in {PUBLIC_MODULES!r}: importlib.import_module(m)\n"
        "from airflow_cloudtrain.catalog import choose_offer\n"
        "from airflow_cloudtrain.spec import Hardware\n"
        "choose_offer('ec2', Hardware(cpus=2))\n"
        "print(json.dumps(sorted({m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 'aiobotocore')"
        " or m.startswith('google.cloud')} - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_providers_page_links_to_our_own_documentation() -> None:
    """The Providers page links the package name to ``documentation_url``, falling back to
    airflow.apache.org/docs/<package>/ (no page exists there for us) when it is empty."""
    from airflow.api_fastapi.core_api.services.public.providers import _provider_mapper
    from airflow.providers_manager import ProvidersManager

    provider = ProvidersManager().providers["airflow-cloudtrain"]
    shown = _provider_mapper(provider)
    assert shown.documentation_url == airflow_cloudtrain.DOCS_URL
    assert shown.documentation_url.startswith("https://github.com/airflow-cloudtrain/")
    assert airflow_cloudtrain.get_provider_info()["documentation-url"] == airflow_cloudtrain.DOCS_URL
