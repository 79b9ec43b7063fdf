"""``triggers.handover.killed_by_user``: a trigger's ``on_kill`` releases the run only when the task
left ``deferred`` for a state the user's action sets, never when Airflow cancelled a late triggerer's
copy of a trigger that now runs elsewhere (the task still deferred). The state comes from Airflow's
Execution API through the triggerer's channel, which only a triggerer process has: here its reader
(``_task_state``) is replaced by the answer Airflow would give; the production deployment's test
(``tests/deployment/test_production.py``, a frozen triggerer thawed after the hand-over) runs the
real path."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_cloudtrain.triggers import handover

TI = SimpleNamespace(dag_id="d", task_id="train", run_id="r", map_index=-1)


def _decide(monkeypatch: pytest.MonkeyPatch, answer: Any, ti: Any = TI) -> bool:
    def state(asked: Any) -> str | None:
        assert asked is ti
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(handover, "_task_state", state)
    trigger = SimpleNamespace(task_instance=ti)
    return asyncio.run(handover.killed_by_user(trigger, logging.getLogger("test")))


@pytest.mark.parametrize("state", ["deferred", "scheduled", "queued", "running"])
def test_a_handed_over_or_resumed_task_keeps_its_run(monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    assert _decide(monkeypatch, state) is False


@pytest.mark.parametrize("state", ["failed", "success", None, "up_for_retry", "skipped", "removed"])
def test_a_user_s_action_releases_the_run(monkeypatch: pytest.MonkeyPatch, state: str | None) -> None:
    assert _decide(monkeypatch, state) is True


def test_when_the_state_cannot_be_read_it_releases_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _decide(monkeypatch, ConnectionError("supervisor gone")) is True


def test_a_trigger_without_its_task_instance_releases_as_asked() -> None:
    assert asyncio.run(handover.killed_by_user(SimpleNamespace(), logging.getLogger("test"))) is True
