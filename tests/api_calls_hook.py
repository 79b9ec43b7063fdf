"""Every test that runs one of our operators against the emulated clouds: the API calls it made, by side,
checked against the generated permission documents (``airflow_cloudtrain.permissions``), or written to
``$CLOUDTRAIN_RECORD_CALLS/calls-<worker>.jsonl`` when that is set (``make permissions`` merges those
files into ``tests/data/api_calls.json`` and regenerates the documents from it).

A call is charged to the operators whose ``execute``/``execute_complete``/``resume_execution`` ran in the
test (the Airflow side's calls and those of the instances they launched); tests that run none of them
(tests of the parts) are not charged to any operator and not checked. The overhead is a set per test.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

RECORD_ENV = "CLOUDTRAIN_RECORD_CALLS"
_METHODS = ("execute", "execute_complete", "resume_execution")


def _watch_operators(monkeypatch: pytest.MonkeyPatch, ran: set[str]) -> None:
    from airflow_cloudtrain import permissions

    classes = {
        base
        for cls in permissions.operator_classes()
        for base in cls.__mro__
        if base.__module__.startswith("airflow_cloudtrain.")  # EngineOperator's execute too
    }
    for cls in classes:
        for method in _METHODS:
            original = cls.__dict__.get(method)
            if original is None:
                continue

            def wrapped(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
                ran.add(permissions.operator_name(type(self)))
                return __original(self, *args, **kwargs)

            functools.update_wrapper(wrapped, original)
            monkeypatch.setattr(cls, method, wrapped)


@pytest.fixture(autouse=True)
def _api_calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if "_emulator" not in request.fixturenames:
        yield
        return
    from airflow_cloudtrain import permissions
    from airflow_cloudtrain.emulator import calls

    ran: set[str] = set()
    _watch_operators(monkeypatch, ran)
    calls.take()  # an earlier test's late calls are not this one's
    yield
    made = [c for c in calls.take() if c.side != "other"]
    if not ran or not made:
        return
    rows = [{"operator": op, **c._asdict()} for op in sorted(ran) for c in made]
    folder = os.environ.get(RECORD_ENV)
    if folder:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(folder, f"calls-{worker}.jsonl"), "a") as out:
            out.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        return
    # A permission no document grants fails the test. One that only this operator's document lacks (a
    # path the last `make permissions` run did not take for it: a retry, a throttled call) warns: which
    # rare paths a run takes depends on the machine's load, and the suite must not.
    unknown = permissions.missing(rows, anywhere=True)
    if unknown:
        pytest.fail(
            "API calls that no permission document grants (run `make permissions` to regenerate "
            "them from a full run, see the README's Permissions section):\n" + "\n".join(unknown)
        )
    for line in permissions.missing(rows):
        warnings.warn(
            f"permission missing from its operator's document (run `make permissions`): {line}", stacklevel=2
        )
