"""``cloudtrain up --production``'s own pieces that need no running deployment: the secrets file, the
settings Airflow gets, the clear error when PostgreSQL or Redis is missing and apt-get cannot run, and
the plain ``cloudtrain up`` still choosing the plain deployment. The deployment itself is
``tests/deployment/test_production.py``."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest

from airflow_cloudtrain import cli_up, cli_up_production
from airflow_cloudtrain.cli_up_production import PROD_ENV_FILE, production_env, production_settings


def test_the_passwords_are_made_once_kept_private_and_reused(tmp_path: Path) -> None:
    first = production_settings(tmp_path)
    assert stat.S_IMODE((tmp_path / PROD_ENV_FILE).stat().st_mode) == 0o600
    assert production_settings(tmp_path) == first  # a restart finds its database again
    assert (
        len({first["POSTGRES_SUPERUSER_PASSWORD"], first["AIRFLOW_DB_PASSWORD"], first["REDIS_PASSWORD"]})
        == 3
    )


def test_airflow_gets_celery_on_postgres_and_redis(tmp_path: Path) -> None:
    settings = production_settings(tmp_path)
    env = production_env(settings)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
    assert f"127.0.0.1:{settings['POSTGRES_PORT']}/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CELERY__BROKER_URL"] == (
        f"redis://:{settings['REDIS_PASSWORD']}@127.0.0.1:{settings['REDIS_PORT']}/0"
    )


def test_missing_packages_without_root_name_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_up_production.shutil, "which", lambda name: None)
    monkeypatch.setattr(cli_up_production, "_postgres_bin", lambda name: None)
    monkeypatch.setattr(cli_up_production.os, "geteuid", lambda: 1000)
    with pytest.raises(cli_up.UpError, match=r"apt-get install -y postgresql redis-server"):
        cli_up_production.ensure_packages()


def test_plain_up_keeps_the_plain_deployment_and_production_is_a_flag() -> None:
    from airflow_cloudtrain.cli import build_parser

    parser = build_parser()  # the ``cloudtrain`` command's own
    plain, production = parser.parse_args(["up"]), parser.parse_args(["up", "--production"])
    assert cli_up._deployment(plain) is cli_up.local_airflow
    assert cli_up._deployment(production) is cli_up_production.production_airflow
    # cli_up alone (it never imports the production shape, which builds on it): --production says so
    bare = argparse.ArgumentParser()
    cli_up.add_up_parser(bare.add_subparsers())
    with pytest.raises(cli_up.UpError, match="--production is not available"):
        cli_up._deployment(bare.parse_args(["up", "--production"]))
