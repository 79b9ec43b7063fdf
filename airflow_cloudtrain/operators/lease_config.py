"""``orphan_timeout``: how long a run may go unwatched before it ends itself (``contract.lease``).

Checked at construction (DAG parse time) when known, and again once templates are rendered, like
every other argument. Why each rule:

- not a duration: a ValueError naming the field and the accepted forms (None turns leases off);
- shorter than ``MIN_POLLS_PER_TIMEOUT`` poll intervals: the watcher renews the lease from its polls,
  so a timeout of one or two polls would end healthy runs after one slow poll: a ValueError;
- longer than ``max_runtime``: the run stops at ``max_runtime`` before its lease could ever lapse, so
  the lease never matters: a warning (the run is fine, only the argument has no effect).

The default (30 minutes) is never refused nor warned about: a run shorter than it simply never needs
its lease, and with a ``poll_interval`` over 10 minutes it becomes 3 poll intervals.
"""

from __future__ import annotations

from typing import Any

from airflow_cloudtrain.contract.lease import DEFAULT_ORPHAN_TIMEOUT_S, MIN_POLLS_PER_TIMEOUT
from airflow_cloudtrain.operators.checks import is_deferred_value, parse_duration, warn_user

DEFAULT_ORPHAN_TIMEOUT = "30m"
ORPHAN_FORMS = ", or None (no lease: the run then depends on max_runtime alone)"


def parse_orphan_timeout(
    value: Any, poll_interval: float | None = None, max_runtime_s: float | None = None
) -> float | None:
    """Seconds, or None (``orphan_timeout=None``: off). ``poll_interval`` / ``max_runtime_s`` (seconds,
    None while unknown) are checked against it."""
    if value is None:
        return None
    seconds = parse_duration(value, "orphan_timeout", ORPHAN_FORMS)
    if seconds is None:  # "" : neither a duration nor None
        raise ValueError(
            f"orphan_timeout={value!r} is not a valid duration: use a duration such as '30m' (the "
            f"default is {DEFAULT_ORPHAN_TIMEOUT_S / 60:g} minutes){ORPHAN_FORMS}"
        )
    default = seconds == DEFAULT_ORPHAN_TIMEOUT_S  # left alone: fitted to the polls, never warned about
    if default and poll_interval is not None:
        return max(seconds, MIN_POLLS_PER_TIMEOUT * poll_interval)
    if poll_interval is not None and seconds < MIN_POLLS_PER_TIMEOUT * poll_interval:
        raise ValueError(
            f"orphan_timeout={value!r} ({seconds:g} s) is shorter than {MIN_POLLS_PER_TIMEOUT} x "
            f"poll_interval ({poll_interval:g} s): the lease is renewed from the polls, so one slow poll "
            f"would end a healthy run; use at least {MIN_POLLS_PER_TIMEOUT * poll_interval:g} s, or a "
            "shorter poll_interval"
        )
    if max_runtime_s is not None and max_runtime_s < seconds and not default:
        warn_user(
            f"orphan_timeout={value!r} ({seconds:g} s) is longer than max_runtime ({max_runtime_s:g} s): "
            "the run stops at max_runtime before its lease could lapse, so orphan_timeout has no effect"
        )
    return seconds


def check_orphan_timeout(value: Any, poll_interval: float | None, max_runtime: Any) -> None:
    """The parse-time check: what is known now (a templated value waits for rendering)."""
    if is_deferred_value(value):
        return
    max_runtime_s: float | None = None
    if not is_deferred_value(max_runtime):
        from airflow_cloudtrain.operators.config import parse_max_runtime

        try:
            max_runtime_s = parse_max_runtime(max_runtime)
        except ValueError:  # max_runtime's own check names it
            max_runtime_s = None
    parse_orphan_timeout(value, poll_interval, max_runtime_s)
