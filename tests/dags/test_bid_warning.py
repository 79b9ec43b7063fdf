"""A bid on ``gcspot`` has no effect, and a run says so once (README, "Rules users rely on").

In Airflow each part of a deferred task runs in a fresh process: the start, and the resumption after
the trigger, each parsing the DAG file first. ``dag.test()`` runs both in this one process, so the
test clears the warning's once-per-process memory where a fresh process would begin.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from dag_helpers import task_states, write_dag, xcom

from airflow_cloudtrain.catalog import select

WARNING = "has no effect on cloud='gcspot'"


def shown(out: str, recorded: Any) -> int:
    """How often the warning reached the user: task log lines, and warnings Python recorded."""
    return out.count(WARNING) + sum(WARNING in str(w.message) for w in recorded)


def test_a_deferred_gcspot_run_with_a_bid_says_once_that_it_is_ignored(
    emu, airflow_db, monkeypatch, capfd, recwarn
) -> None:
    from airflow.sdk.definitions import dag as dag_module

    source = textwrap.dedent(
        """
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import CloudTrainOperator

        with DAG("gcspot_bid_once", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            CloudTrainOperator(task_id="train", cloud="gcspot", bid="60%", cpus=2, ram="4g",
                               command="sleep 5; echo trained", bucket="gs://cloudtrain-emulated/bid",
                               region="us-central1", poll_interval=0.5, live_prices=False, deferrable=True)
        """
    )
    from airflow.sdk.execution_time import supervisor

    dag = write_dag(source, "gcspot_bid_once")
    real_run, real_trigger = supervisor.run_task_in_process, dag_module._run_inline_trigger
    processes: list[str] = []

    def in_a_fresh_process(*args: Any, **kwargs: Any) -> Any:
        """Each part of the task (its start, its resumption) runs in a process of its own in Airflow;
        what came before the first (dag.test()'s parse of the file: the DAG processor's) is not
        the task's."""
        if not processes:
            recwarn.clear()
        processes.append("task")
        monkeypatch.setattr(select, "_warned_gcspot_bid", False)
        return real_run(*args, **kwargs)

    def trigger(trigger: Any, ti: Any) -> Any:
        processes.append(type(trigger).__name__)
        return real_trigger(trigger, ti)

    monkeypatch.setattr(supervisor, "run_task_in_process", in_a_fresh_process)
    monkeypatch.setattr(dag_module, "_run_inline_trigger", trigger)
    run = dag.test()
    assert task_states(run) == {"train": "success"} and xcom(run, "train")["exit_code"] == 0
    assert processes == ["task", "RunTrigger", "task"]  # it deferred, and resumed
    assert shown(capfd.readouterr().out, recwarn) == 1


def test_the_task_process_parse_leaves_the_warning_to_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DAG processor's parse warns (the DAG's author sees it); the parse a task process makes before
    running the task does not (the run logs it itself, once)."""
    from airflow.sdk.definitions._internal.dag_parsing_context import _airflow_parsing_context_manager

    from airflow_cloudtrain.operators import CloudTrainOperator

    def build() -> None:
        CloudTrainOperator(
            task_id="t",
            cloud="gcspot",
            bid="60%",
            command="true",
            bucket="gs://my-bucket/training",
            live_prices=False,
        )

    monkeypatch.setattr(select, "_warned_gcspot_bid", False)
    with pytest.warns(UserWarning, match=WARNING):
        build()
    monkeypatch.setattr(select, "_warned_gcspot_bid", False)
    import warnings

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        with _airflow_parsing_context_manager(dag_id="d", task_id="t"):
            build()
    assert [str(w.message) for w in recorded if WARNING in str(w.message)] == []
