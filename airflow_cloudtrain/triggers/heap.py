"""The triggerer's long-lived heap, kept out of the garbage collector's full passes.

A full collection walks every tracked object of the process and holds the interpreter meanwhile:
the triggerer's event loop, and so every trigger in it, stops for as long as it takes. Most of a
triggerer's heap is what it imported (Airflow, the providers, the SDKs: about 160,000 objects once
``RunTrigger`` is imported) and lives as long as the process. Measured with 1,000 deferred runs
(``benchmarks/triggerer_scale.py``, docs/benchmarks.md) those passes were the loop's longest stalls:
190-234 ms of CPU each, over 300 ms of wall time on a busy machine.

So the first time a run wait or an instance watch starts in a process, its heap as it is then is
moved into the collector's permanent generation (``gc.freeze()``, a constant-time splice of its
lists), which full passes skip. Frozen objects are still freed as soon as their last reference goes;
only reference cycles among them are never collected: garbage cycles not yet collected at that moment,
and cycles that become garbage later. Once per process, that is bounded by the heap of that moment,
most of which lives as long as the process. (Airflow's DAG processor keeps its heap frozen the same
way.) No collection runs first: that would be one full pause more. ``[cloudtrain]
freeze_triggerer_heap = False`` (``AIRFLOW__CLOUDTRAIN__FREEZE_TRIGGERER_HEAP``) turns it off.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

_frozen = False


def freeze_long_lived() -> bool:
    """Freeze the heap as it is now, the first time only (and unless configured off); True when it
    froze it now. Call from the event loop, before the trigger builds anything of its own."""
    global _frozen
    if _frozen:
        return False
    _frozen = True  # asked once per process, whatever the answer
    if not _enabled():
        return False
    gc.freeze()
    log.debug("Froze %d objects of the triggerer's startup heap", gc.get_freeze_count())
    return True


def _enabled() -> bool:
    try:
        from airflow.sdk import conf

        return conf.getboolean("cloudtrain", "freeze_triggerer_heap", fallback=True)
    except Exception as err:  # a bad value: keep Python's default behaviour
        log.warning("[cloudtrain] freeze_triggerer_heap unreadable (%s): not freezing", err)
        return False
