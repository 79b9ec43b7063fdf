"""Whether Airflow called a trigger's ``on_kill`` for a user's action on the task, or for a hand-over.

Airflow calls ``on_kill`` when it cancels a trigger that is no longer meant to run in this triggerer,
and documents that as "the user acted on the task" (mark failed, mark succeeded, clear), never a
redistribution. But a triggerer that was alive and only late on its heartbeat (a long pause, a frozen
VM, a loaded machine) has its triggers handed to another triggerer meanwhile; when it resumes, it
cancels its own copies down the same path, with the same message, so ``on_kill`` runs there too
(``TriggerRunnerSupervisor.update_triggers``: every running trigger the database no longer assigns
to this triggerer). Releasing then would terminate a run that its new triggerer is watching: the
production deployment's test froze a triggerer (SIGSTOP) past the health check and saw exactly that,
an instance terminated under a live run and a relaunch.

A user's action moves the task out of ``deferred`` before its trigger is cancelled; a hand-over leaves
it ``deferred``, and a trigger that fired elsewhere has it ``scheduled``, ``queued`` or ``running``
(the task itself then ends the run). So ``on_kill`` first asks Airflow for the task's state (the
Execution API, through the triggerer's supervisor) and releases only when the task is none of these.
When it cannot tell, it releases, as before: a user's kill is the case ``on_kill`` exists for.
"""

from __future__ import annotations

import asyncio
from typing import Any

# the task still owns its run: deferred (the trigger runs in another triggerer), or resumed by the
# event the other copy fired (it ends the run itself)
TASK_ALIVE = frozenset({"deferred", "scheduled", "queued", "running"})


def _task_state(ti: Any) -> str | None:
    """The task instance's state now, from Airflow's Execution API (a blocking call: its own thread)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    map_index = getattr(ti, "map_index", -1)
    states = RuntimeTaskInstance.get_task_states(
        dag_id=ti.dag_id,
        task_ids=[ti.task_id],
        run_ids=[ti.run_id],
        map_index=map_index,
    )
    row = states.get(ti.run_id) or {}
    key = ti.task_id if map_index is None or map_index < 0 else f"{ti.task_id}_{map_index}"
    state = row.get(key)
    return None if state is None else str(getattr(state, "value", state))


async def killed_by_user(trigger: Any, log: Any) -> bool:
    """Whether ``trigger.on_kill`` should release its cloud work (see the module's docstring)."""
    ti = getattr(trigger, "task_instance", None)
    if ti is None:  # not run by a triggerer that says which task it serves: as asked
        return True
    try:
        state = await asyncio.to_thread(_task_state, ti)
    except Exception as err:  # the triggerer's channel or the API failing: release, as asked
        log.warning("Could not read the task's state (%s: %s): releasing as asked", type(err).__name__, err)
        return True
    if state in TASK_ALIVE:
        log.info(
            "Cancelled in this triggerer, but the task is still %s: the trigger was handed to another "
            "triggerer (this one was late on its heartbeat), not killed; nothing released",
            state,
        )
        return False
    return True
