"""Throttling shared by every emulated API: which requests fail as "slow down", drawn reproducibly.

One ``Throttle`` is handed to the moto middleware, the Compute Engine server and the GCS server; each
asks ``hit(service, operation)`` for every request that is not the emulator's own (user agent with
``cloudtrain-emulator``) and, on a hit, answers with that API's own throttling error.

Selectors (``api=``): a service (``"ec2"``, ``"s3"``, any other AWS service by its signing name such
as ``"ssm"``, ``"compute"``, ``"storage"``), an operation (an EC2 action like ``"DescribeInstances"``,
an S3 operation like ``"GetObject"``, a Compute method like ``"instances.list"``, a GCS method like
``"objects.get"``), or ``None`` for everything. A request matching several rules uses the highest rate.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable

EMULATOR_USER_AGENT = "cloudtrain-emulator"
ALL = "*"


def is_own(*user_agents: str | None) -> bool:
    """True for the emulator's own requests (never counted, never throttled)."""
    return any(EMULATOR_USER_AGENT in (ua or "") for ua in user_agents)


class Throttle:
    """Rates per selector and one seeded ``random.Random``: the same calls in the same order fail the
    same way from run to run (concurrent callers interleave their draws, as they interleave requests)."""

    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._rates: dict[str, float] = {}
        self._random = random.Random(seed)

    def set(self, rate: float, api: str | Iterable[str] | None = None, seed: int | None = 0) -> None:
        """Fail ``rate`` (0..1) of the requests ``api`` selects; rate 0 lifts the rule. ``seed``
        restarts the draws (None: go on with the current ones)."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1; got {rate!r}")
        selectors = [ALL] if api is None else [api] if isinstance(api, str) else list(api)
        if not selectors or not all(isinstance(s, str) and s for s in selectors):
            raise ValueError(f"api must be a service or operation name, or a list of them; got {api!r}")
        with self._lock:
            for selector in selectors:
                if rate:
                    self._rates[selector] = rate
                else:
                    self._rates.pop(selector, None)
            if seed is not None:
                self._random.seed(seed)

    def clear(self) -> None:
        with self._lock:
            self._rates.clear()

    def hit(self, service: str, operation: str) -> bool:
        """Draw for one request: True when it is to be refused as throttled."""
        with self._lock:
            if not self._rates:
                return False
            rate = max(self._rates.get(key, 0.0) for key in (ALL, service, operation))
            return rate > 0.0 and self._random.random() < rate
