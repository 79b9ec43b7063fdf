"""The engines: everything between "run this job" and "the hardware is given back", one folder each.

Every engine implements ``core.engine.Engine`` and is driven by the one operator skeleton
(``operators.base.EngineOperator``); what they share is below them in ``core/`` (the ledger,
retries, billing, records, the poll loop) and the provider face in ``clouds/``.

- ``run/``      the single run (``CloudTrainOperator``): ``attempt.RunAttempt`` delivers an earlier
                try's unreported result, adopts its live instance, or launches (``core.launcher``:
                capacity failover); waits (``core.engine.poll_until`` here, ``triggers.run`` when
                deferred, both deciding with ``core.waiting.RunWatch``); finishes: release, mark
                delivered, account (``core.billing``). ``abandon.abandon_run`` is the one release of
                a run whose end will not be reported (worker and triggerer). ``engine.SingleRun``.
- ``resume/``   the checkpoint-resume loop (``CheckpointResumeOperator``): see its map of how a spot
                interruption is noticed, survived and relaunched.
- ``fleet/``    a work queue on a group of workers (``SpotFleetOperator``, ``PreemptibleGroupOperator``):
                ``run.FleetRun`` makes the queue, template and group under the ledger, ``watch`` scales
                and reads outcomes, ``engine.FleetEngine``; the provider's part is a
                ``core.fleet.FleetBackend`` (``clouds/aws/fleet.py``, ``clouds/gcp/fleet.py``).
- ``vertex/``   a Vertex AI custom job (``MLEngineTrainOperator``): ``job`` (find / submit, wait),
                ``logs`` (Cloud Logging lines, a persisted cursor), ``package``, ``cost``, ``engine``.
- ``prepare``   offers, the run folder's spec / agent / code, and the launch requests (hard stop, tags).
- ``run_secrets`` the operator's side of ``secret_env``: references into the spec, the run's own secrets.
"""
