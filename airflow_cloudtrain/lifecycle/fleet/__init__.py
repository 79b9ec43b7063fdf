"""The work-queue fleet: a queue, a template and a group of workers, made once and torn down once.

The same on every provider (the provider's parts: ``core.fleet.FleetBackend``, picked by
``clouds.registry.fleet_backend_for``):

- ``handle.py``: ``FleetSettings`` (the parsed arguments) and ``FleetHandle`` (what the wait needs).
- ``run.py``: ``FleetRun``, the order of creation (queues, run folder, items, template, group) and the
  one teardown (``release_fleet``, through the ledger).
- ``watch.py``: ``FleetWatch``, one poll (scaling, outcomes, dead letters, the end) and the result
  (per-item outcomes, workers, interruptions, cost through ``core.billing``).
- ``engine.py``: ``FleetEngine``, the above as a ``core.engine.Engine`` for the operator skeleton.
"""
