"""The run lifecycle: everything between "run this job" and "the hardware is given back".

One folder for the newcomer. An operator builds a ``RunContext`` (its parsed configuration, the run
key, a ``RunBackend`` from ``clouds.registry``) and drives ``RunAttempt``:

- ``attempt``   one launch-run-release cycle: deliver an earlier try's unreported result, adopt its
                live instance, or launch (``launcher``: capacity failover); wait (blocking here, or
                deferred in ``triggers.run``, both deciding with ``waiting.RunWatch``); finish:
                release, mark delivered, account (``costs``).
- ``ledger``    the write-ahead resource ledger: every create call is recorded before it is made,
                and every teardown path (success, failure, on_kill, a failed deferral, a retry) goes
                through ``ResourceLedger.release``; ``sweep`` rebuilds it from run-key tags. Resource
                kinds register a finder and a deleter (``register_kind``).
- ``records``   the typed records between layers: ``LaunchRecord``, ``Outcome``, ``Attempt``.
- ``retry``     transient errors (throttling, 5xx, dropped connections) waited out for minutes.
- ``prepare``   offers, the run folder's spec/agent/code, and the launch requests (hard stop, tags).
- ``logstream`` the job's log chunks, in order and each once.
"""
