"""Transient cloud errors (throttling, 5xx, dropped connections) are waited out, not fatal.

The SDKs retry a few times within one call; a throttled account or a storage blip can last minutes.
Both waits (the blocking loop on a worker and the trigger) keep a ``TransientBudget``: a poll that
hits a transient error backs off and polls again, and only once errors have lasted ``budget_s``
without a single good poll is the run declared lost (and its resources released). Capacity errors
are not transient here: they arrive as HTTP 500 on EC2, but the launcher moves on at once instead.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# A capacity or quota answer is not transient here even when it comes as HTTP 500 (EC2 does that):
# the launcher moves on to the next zone or offer at once instead of asking the same place again.
NOT_TRANSIENT_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
    }
)
# Google sends rate limits as 403 with these reasons; a 403 is otherwise a real refusal.
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})


def error_code(err: BaseException) -> str:
    """The cloud's error code or reason of a botocore / google-api-core / our error ('' if none)."""
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    for detail in getattr(err, "errors", None) or []:
        reason = detail.get("reason", "") if isinstance(detail, dict) else getattr(detail, "reason", "")
        if reason:
            return str(reason)
    code = getattr(err, "code", "")
    return code if isinstance(code, str) else ""


def is_transient(err: BaseException) -> bool:
    """Would the same call likely succeed a little later? Throttling, 5xx, dropped connections: yes
    (the agent's classification, ``agent.retry.is_transient``, which looks through wrapped errors
    such as our ``CloudError`` mapped from a botocore ``ClientError``); capacity and quota: no."""
    from airflow_cloudtrain.contract.errors import CapacityUnavailable, QuotaExceeded
    from airflow_cloudtrain.contract.retry import causes
    from airflow_cloudtrain.contract.retry import is_transient as transient_storage_error

    for link in causes(err):
        if isinstance(link, (CapacityUnavailable, QuotaExceeded)) or error_code(link) in NOT_TRANSIENT_CODES:
            return False
        if error_code(link) in RATE_LIMIT_REASONS:
            return True
    return transient_storage_error(err)


class TransientBudget:
    """How long a wait tolerates transient errors in a row, and how long to back off after each."""

    def __init__(
        self,
        budget_s: float = 600.0,
        base_s: float = 1.0,
        cap_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_s = budget_s
        self.base_s = base_s
        self.cap_s = cap_s
        self.clock = clock
        self.failing_since: float | None = None
        self.failures = 0

    def ok(self) -> None:
        self.failing_since = None
        self.failures = 0

    def failed(self, err: BaseException) -> float:
        """Seconds to back off before polling again; re-raises when ``err`` is not transient or the
        budget is spent."""
        if not is_transient(err):
            raise err
        now = self.clock()
        self.failing_since = self.failing_since if self.failing_since is not None else now
        self.failures += 1
        if now - self.failing_since > self.budget_s:
            raise err
        return min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 10)) * random.uniform(0.5, 1.0)


def call_with_retry(
    fn: Callable[[], T],
    budget: TransientBudget | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    on_retry: Callable[[BaseException, float], Any] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, backing off on transient errors within ``budget``."""
    budget = budget or TransientBudget(budget_s=300.0)
    while True:
        try:
            value = fn()
        except Exception as err:
            delay = budget.failed(err)
            if on_retry is not None:
                on_retry(err, delay)
            sleep(delay)
            continue
        budget.ok()
        return value
