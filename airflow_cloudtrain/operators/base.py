"""The one operator skeleton: execute, defer, ``execute_complete``, ``__fail__`` and ``on_kill``
over an engine (``core.engine.Engine``), written once for every operator of the family.

An operator subclass is configuration: it checks its arguments at construction and says which
engine runs it (``new_engine``); it may publish console links for each handle (``on_handle``).
The skeleton never imports the run machinery at module level, so DAG parsing stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.core.engine import Engine, Step


class EngineOperator(BaseOperator):
    """Drives an ``Engine`` to its end, in this worker or through the triggerer.

    ``deferrable`` frees the worker slot while waiting; a task killed on the worker (``on_kill``), a
    wait that fails, and a deferral that fails (``__fail__``: the trigger crashed or timed out) all
    release what the run made, through the engine's ledger.
    """

    deferrable: bool = False
    _engine: Engine[Any] | None = None

    def new_engine(self, context: Context) -> Engine[Any]:
        """The task's engine, built from the rendered arguments (each call a fresh one: a resumed
        task runs in a new process)."""
        raise NotImplementedError

    def on_handle(self, context: Context, engine: Engine[Any], handle: Any) -> None:
        """A run is in flight on ``handle`` (its console links, say). Must not fail the task."""

    def _new(self, context: Context) -> Engine[Any]:
        self._engine = self.new_engine(context)
        return self._engine

    def execute(self, context: Context) -> Any:
        engine = self._new(context)
        return self._drive(context, engine, engine.start())

    def execute_complete(self, context: Context, event: Any = None) -> Any:
        """Back from the trigger: the engine reads its event; anything but success raises."""
        engine = self._new(context)
        return self._drive(context, engine, engine.resume(event))

    def _drive(self, context: Context, engine: Engine[Any], step: Step[Any]) -> Any:
        while not step.done:
            handle = step.handle
            self.on_handle(context, engine, handle)
            if self.deferrable and not engine.over(handle):  # an ended run finishes here
                spec = engine.trigger(handle)
                self.defer(trigger=spec.build(), method_name=spec.method_name)
            try:
                outcome = engine.wait(handle)
            except BaseException as err:  # killed, timed out, or the wait failed: nothing may outlive it
                engine.abandon(f"{type(err).__name__}: {err}"[:300])
                raise
            step = engine.advance(handle, outcome)
        return step.result

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A trigger that crashed or timed out resumes with ``__fail__`` and never reaches
        ``execute_complete``: release the run through its ledger first."""
        if next_method == "__fail__":
            try:
                self._new(context).abandon("the deferred wait failed")
                self.log.info("Released the run's resources after the deferred wait failed")
            except Exception:
                self.log.exception("Teardown after the failed deferral did not complete")
        return super().resume_execution(next_method, next_kwargs, context)

    def on_kill(self) -> None:
        """The task was killed on the worker (while launching or waiting): release with it."""
        if self._engine is not None:
            self._engine.kill()
