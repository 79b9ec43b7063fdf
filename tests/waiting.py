"""The suite's one wait-for-condition helper: poll a condition until it holds, with a deadline sized for
a loaded machine (two cores shared by the suite's workers, emulated clouds and Airflow processes).

A test waits on the condition it expects, never on a fixed sleep: ``wait_for`` returns the condition's
first truthy value, so a test can wait and use what it waited for in one step. On timeout it fails the
test with what was awaited and the last value seen, which is what one needs to tell "slow" from "wrong".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Generous: on a busy machine an instance's boot, an agent's first status or a deferred task's first
# poll can take tens of seconds. A deadline only bounds a hang; it never times the product.
DEFAULT_TIMEOUT_S = 120.0


def wait_for(
    condition: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.1,
    message: str | None = None,
) -> T:
    """``condition()``'s first truthy value, polled every ``interval`` seconds; an AssertionError naming
    ``message`` (or the condition) and the last value seen once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(condition, "__name__", repr(condition))
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last value: {value!r})")
        time.sleep(interval)
