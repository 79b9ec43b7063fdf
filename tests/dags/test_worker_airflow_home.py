"""Each test worker's Airflow is its own: a worker forked from the warm parent (``tests/worker_zygote.py``),
which imported Airflow with the xdist controller's home, was moved to its own home (``airflow_rehome``)
before any test ran. Its settings name only its home, and a DAG run lands in its own DB file."""

from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Any

from dag_helpers import write_dag

DAG = """
from datetime import datetime
from airflow.sdk import DAG, task

with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    @task
    def hello() -> str:
        return "hello"

    hello()
"""


def test_this_workers_airflow_reads_and_writes_only_its_own_home(airflow_db: Any) -> None:
    from airflow import configuration, settings
    from airflow.configuration import conf

    home = os.environ["AIRFLOW_HOME"]
    assert configuration.AIRFLOW_HOME == settings.AIRFLOW_HOME == home
    database = os.path.join(home, "airflow.db")
    assert f"sqlite:///{database}" == settings.SQL_ALCHEMY_CONN
    assert settings.engine is not None and settings.engine.url.database == database
    for section, key in (("logging", "base_log_folder"), ("core", "plugins_folder")):
        assert conf.get(section, key).startswith(home + os.sep), (section, key, conf.get(section, key))

    dag_id = f"home_{uuid.uuid4().hex[:8]}"
    run = write_dag(DAG.format(dag_id=dag_id), dag_id).test()
    assert run.state == "success"
    with sqlite3.connect(database) as db:  # the worker's own file holds the run
        rows = db.execute("SELECT state FROM dag_run WHERE dag_id = ?", (dag_id,)).fetchall()
    assert rows == [("success",)]
