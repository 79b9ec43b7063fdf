"""Airflow's OpenLineage provider, switched on for one test the way a user switches it on: the
``[openlineage] transport`` setting (``AIRFLOW__OPENLINEAGE__TRANSPORT``), here openlineage-python's
``file`` transport appending one JSON event per line. The provider's plugin reads the setting when
it is imported (``plugins/openlineage.py``: no transport, no listener), and Airflow caches its plugins
and its listener managers per process, so the switch re-imports the plugin and drops those caches on
the way in and again on the way out (the suite's other runs emit nothing).

Under ``dag.test()`` (no executor) every task runs in the test's process
(``run_task_in_process``), and the task runner's ``finalize`` calls the listener's
``on_task_instance_success`` there; the listener extracts the operator's lineage
(``get_openlineage_facets_on_complete``) and emits the COMPLETE event while the task waits for it
(``[openlineage] execution_timeout``). By default it does that in a ``fork()`` of the task's process
(where an XCom read hangs until that timeout under ``dag.test()``: the operators keep their result
instead, ``tests/unit/test_lineage.py``); here it does it in a thread (``[openlineage]
execute_in_thread``, the provider's opt-in): the five system tests took 39 s with it and 44 to 60 s
forking the test's process for each event (35 s with the listener off; ``-n 2``, 2 cores).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SETTINGS = (
    "AIRFLOW__OPENLINEAGE__TRANSPORT",
    "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD",
    "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT",  # how long the task waits for the emission (10 s)
)


def _reload_listeners() -> None:
    """Airflow loads plugins (and the provider's listener with them) afresh on their next use: the
    task runner's (task events) and the core's (DAG run events, which ``dag.test()`` also fires)."""
    from airflow import plugins_manager as core_plugins
    from airflow.listeners import listener as core_listener
    from airflow.providers.openlineage.plugins import listener, openlineage
    from airflow.sdk import lineage as hook_lineage
    from airflow.sdk import listener as sdk_listener
    from airflow.sdk import plugins_manager

    old = listener.get_openlineage_listener()
    if old._executor is not None:  # the DAG run events' process pool: let it finish its writes
        old._executor.shutdown(wait=True)
        old._executor = None
    listener.get_openlineage_listener.cache_clear()  # a fresh client for the current transport
    importlib.reload(openlineage)
    for cached in (
        plugins_manager._get_plugins,
        plugins_manager.get_hook_lineage_readers_plugins,
        hook_lineage.get_hook_lineage_collector,
        sdk_listener.get_listener_manager,
        core_plugins._get_plugins,
        core_listener.get_listener_manager,
    ):
        cached.cache_clear()


@contextmanager
def openlineage_to_file(path: Path) -> Iterator[Path]:
    """The OpenLineage provider on, its events appended to ``path``; off again afterwards."""
    saved = {name: os.environ.get(name) for name in SETTINGS}
    os.environ[SETTINGS[0]] = json.dumps({"type": "file", "log_file_path": str(path), "append": True})
    os.environ[SETTINGS[1]] = "True"
    os.environ[SETTINGS[2]] = "300"  # a loaded machine must not drop the event
    _reload_listeners()
    try:
        yield path
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reload_listeners()


def complete_event(path: Path, dag_id: str, task_id: str) -> dict[str, Any]:
    """The one COMPLETE event the listener emitted for the task (job ``<dag_id>.<task_id>``)."""
    lines = path.read_text().splitlines() if path.exists() else []
    events = [json.loads(line) for line in lines if line.strip()]
    found = [
        e for e in events if e.get("eventType") == "COMPLETE" and e["job"]["name"] == f"{dag_id}.{task_id}"
    ]
    assert len(found) == 1, [(e.get("eventType"), e.get("job", {}).get("name")) for e in events]
    return found[0]
