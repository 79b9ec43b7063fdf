"""The checkpoint-resume loop: attempts, the recovery decision, the history and its ledger.

How a spot interruption is handled, step by step (each step names where it lives):

1. **The notice.** The agent on the instance polls the metadata service for the cloud's notice
   (EC2's two-minute ``spot/instance-action``, GCE's ``preempted``): ``agent/watcher.py``.
2. **The stop.** The agent signals the job (it may write a last checkpoint within the notice's grace),
   uploads the newest complete checkpoint and the log, and writes the final status ``interrupted``:
   ``agent/runner.py``, ``agent/checkpoints.py``; the status and checkpoint layout are the contract's
   (``contract/runs.py``, ``contract/checkpoint.py``).
3. **The outcome.** The wait (``core.waiting.RunWatch``: blocking in ``lifecycle/run/attempt.py``,
   deferred in ``triggers/run.py``) reads ``interrupted``, or an instance that ended without a status,
   as an interruption; the attempt is released through the ledger and billed (``core.billing``).
4. **The decision.** ``recovery.py`` counts it against ``max_restarts`` (interruptions), not ``max_restarts_on_errors`` (the job's own failures),
   asks the spot policy (``policy/``: spot again, on-demand, or wait) and writes the attempt's row in
   the history (``history.py``); ``loop.py`` (``RecoveryLoop``) launches the next attempt.
5. **The resume.** The new instance's agent restores the newest complete checkpoint before the job
   starts (``agent/checkpoints.py``), and the job reads it with ``airflow_cloudtrain.checkpoint``.

``engine.ResumeRun`` is the loop as a ``core.engine.Engine`` for the operator skeleton.
"""
