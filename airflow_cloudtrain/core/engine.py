"""The engine protocol every run shape implements, and the one poll loop it waits with.

An *engine* is one task's run machinery: the single run (``lifecycle.run``), the checkpoint-resume
loop (``lifecycle.resume``), a work-queue fleet (``lifecycle.fleet``) and a Vertex AI job
(``lifecycle.vertex``). ``operators.base.EngineOperator`` drives any of them the same way:

    step = engine.start()                       # launch or adopt; maybe already done
    while step is not done:
        defer on engine.trigger(handle)         # deferrable: the triggerer waits ...
        or outcome = engine.wait(handle)        # ... or this worker does (``poll_until``)
        step = engine.advance(handle, outcome)  # release, account; the resume loop may go on
    return step.result                          # the XCom dict; a failure raised instead

Back from a trigger, ``engine.resume(event)`` gives the next step; a deferral that failed
(``__fail__``), a kill or a failed wait call ``engine.abandon(reason)``, which releases everything
the run made through its ledger. ``on_kill`` calls ``engine.kill()`` from Airflow's signal handler.

Triggers are named, not imported (``TriggerSpec``: Airflow's own serialized form, a classpath and
plain JSON kwargs), so an engine never imports the trigger floor above it.

The transient-error poll loop is written here once, in a blocking form (``poll_until``) and an
async form (``apoll_until``): a poll that hits a transient cloud error backs off within a
``TransientBudget`` and polls again; any other error, or transient ones lasting past the budget,
propagate.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from airflow_cloudtrain.core.retry import TransientBudget

H = TypeVar("H")
T = TypeVar("T")


class Log(Protocol):
    """What an engine writes its lines to: a ``logging.Logger``, or the task's (Airflow's structlog
    logger, which takes the same ``%``-style calls)."""

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...


@dataclass(frozen=True)
class TriggerSpec:
    """A trigger as Airflow stores it: ``classpath`` and JSON-serializable ``kwargs``."""

    classpath: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    method_name: str = "execute_complete"

    def build(self) -> Any:
        """The trigger object (imported only now, in the task process that defers)."""
        module, _, name = self.classpath.rpartition(".")
        return getattr(importlib.import_module(module), name)(**self.kwargs)


@dataclass(frozen=True)
class Step(Generic[H]):
    """Where a run stands: waiting on ``handle``, or done with ``result`` (the task's XCom)."""

    handle: H | None = None
    result: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    @classmethod
    def waiting(cls, handle: H) -> Step[H]:
        return cls(handle=handle)

    @classmethod
    def finished(cls, result: dict[str, Any]) -> Step[H]:
        return cls(result=result)


class Engine(Protocol[H]):
    """One task's run, whatever its shape (see the module docstring for the order of calls)."""

    def start(self) -> Step[H]:
        """Launch, or adopt what an earlier try of the task launched; done already if it ended."""

    def over(self, handle: H) -> bool:
        """One cheap look just before deferring: has the run already ended? (Never raises.)"""

    def trigger(self, handle: H) -> TriggerSpec:
        """The deferred form of ``wait``."""

    def wait(self, handle: H) -> Any:
        """Block until the run ends (``poll_until``); returns what ``advance`` takes."""

    def advance(self, handle: H, outcome: Any) -> Step[H]:
        """The run ended with ``outcome``: release, account, and say what comes next. Raises (after
        releasing) when the task must fail."""

    def resume(self, event: Any) -> Step[H]:
        """Back from the trigger with its ``event``: the same as ``advance`` for what it reports."""

    def abandon(self, reason: str) -> None:
        """Release everything the run made, when its end will not be reported (a kill, a failed
        wait, a deferral that failed)."""

    def kill(self) -> None:
        """``on_kill``: stop launching and waiting, and release (called from a signal handler)."""


def sleep_unless(
    seconds: float, stopped: Callable[[], bool], sleep: Callable[[float], Any] = time.sleep
) -> None:
    """Sleep ``seconds`` in slices of at most one second, returning early once ``stopped()``."""
    until = time.monotonic() + seconds
    while not stopped():
        left = until - time.monotonic()
        if left <= 0:
            return
        sleep(min(1.0, left))


def poll_until(
    poll: Callable[[], T | None],
    interval_s: float,
    *,
    stopped: Callable[[], bool] = lambda: False,
    on_transient: Callable[[BaseException, float], Any] | None = None,
    budget: TransientBudget | None = None,
) -> T:
    """Call ``poll`` every ``interval_s`` until it returns something other than ``None``.

    A transient error backs off within ``budget`` (``on_transient(err, delay)`` may log it); other
    errors propagate. ``stopped`` cuts the sleeps short (a killed task): ``poll`` itself decides
    what a stop means (raise), since it is called right after."""
    budget = budget or TransientBudget()
    while True:
        try:
            result = poll()
            budget.ok()
        except Exception as err:
            delay = budget.failed(err)  # re-raises when not transient or lasting too long
            if on_transient is not None:
                on_transient(err, delay)
            sleep_unless(delay, stopped)
            continue
        if result is not None:
            return result
        sleep_unless(interval_s, stopped)


async def apoll_until(
    poll: Callable[[], Awaitable[T | None]],
    interval_s: float,
    *,
    on_transient: Callable[[BaseException, float], Any] | None = None,
    budget: TransientBudget | None = None,
) -> T:
    """``poll_until`` for the triggerer: ``poll`` is awaited, the sleeps are ``asyncio.sleep``, and a
    cancellation propagates from wherever it lands."""
    budget = budget or TransientBudget()
    while True:
        try:
            result = await poll()
            budget.ok()
        except Exception as err:
            delay = budget.failed(err)
            if on_transient is not None:
                on_transient(err, delay)
            await asyncio.sleep(delay)
            continue
        if result is not None:
            return result
        await asyncio.sleep(interval_s)
