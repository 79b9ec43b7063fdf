"""Request faults shared by every emulated API: which requests fail as "slow down" (throttled) or with
a server error (unavailable: a 5xx), drawn reproducibly.

One ``Throttle`` is handed to the moto middleware and every emulated Google API; each asks
``draw(service, operation)`` for every request that is not the emulator's own (user agent with
``cloudtrain-emulator``) and, on a hit, answers with that API's own error: its throttling error for
``THROTTLED`` (``set(rate, api)``), its server error for ``UNAVAILABLE`` (``set(rate, api,
kind=UNAVAILABLE)``: EC2 503 ``Unavailable``, S3 500 ``InternalError``, the Google APIs 503
``backendError``), as a region's control plane has bad minutes.

Selectors (``api=``): a service (``"ec2"``, ``"s3"``, any other AWS service by its signing name such
as ``"ssm"``, ``"compute"``, ``"storage"``), an operation (an EC2 action like ``"DescribeInstances"``,
an S3 operation like ``"GetObject"``, a Compute method like ``"instances.list"``, a GCS method like
``"objects.get"``), or ``None`` for everything. A request matching several rules uses the highest rate.

Writes under a prefix (``fail_writes(rate, "s3", "bucket/key/prefix/", side, kind=...)``): a run folder
whose writes fail while its reads still work, as when a bucket's partition has bad minutes or a prefix
is throttled hard (``UNAVAILABLE``: the store's server error), or when a bucket policy or an IAM change
that lands mid-run takes the write permission away (``DENIED``: S3 403 ``AccessDenied``, GCS 403
``forbidden`` naming ``storage.objects.create``). Only the object writes (``WRITES``: S3 PutObject and
the multipart calls, CopyObject; GCS ``objects.insert`` (media, multipart and resumable uploads),
compose, copy, rewrite) of objects whose
``bucket/key`` starts with the prefix are refused, with the kind's error, and only from ``side``:
``"instance"`` (the agents: ``emulator.calls`` tells them apart), ``"airflow"`` (everything else) or
None (both). The servers pass the object's name and the side to ``draw``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable

EMULATOR_USER_AGENT = "cloudtrain-emulator"
ALL = "*"
THROTTLED, UNAVAILABLE, DENIED = "throttled", "unavailable", "denied"
KINDS = (THROTTLED, UNAVAILABLE, DENIED)
WRITE_KINDS = (UNAVAILABLE, DENIED)  # how ``fail_writes`` refuses: a server error, or access denied
# object writes, by S3 operation / GCS JSON API method: what ``fail_writes`` refuses
WRITES = frozenset(
    {
        "PutObject",
        "CreateMultipartUpload",
        "UploadPart",
        "CompleteMultipartUpload",
        "CopyObject",
        "objects.insert",
        "objects.compose",
        "objects.copy",
        "objects.rewrite",
    }
)
SIDES = ("instance", "airflow")


def is_own(*user_agents: str | None) -> bool:
    """True for the emulator's own requests (never counted, never throttled)."""
    return any(EMULATOR_USER_AGENT in (ua or "") for ua in user_agents)


class Throttle:
    """Rates per selector and one seeded ``random.Random``: the same calls in the same order fail the
    same way from run to run (concurrent callers interleave their draws, as they interleave requests)."""

    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[str, dict[str, float]] = {kind: {} for kind in KINDS}
        self._random = random.Random(seed)
        # (service, bucket/prefix, side, kind) -> rate
        self._writes: dict[tuple[str, str, str | None, str], float] = {}

    def set(
        self, rate: float, api: str | Iterable[str] | None = None, seed: int | None = 0, kind: str = THROTTLED
    ) -> None:
        """Fail ``rate`` (0..1) of the requests ``api`` selects with ``kind``; rate 0 lifts the rule.
        ``seed`` restarts the draws (None: go on with the current ones)."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1; got {rate!r}")
        if kind not in KINDS[:2]:  # denied is for a prefix's writes alone (``fail_writes``)
            raise ValueError(f"kind must be one of {KINDS[:2]}; got {kind!r}")
        selectors = [ALL] if api is None else [api] if isinstance(api, str) else list(api)
        if not selectors or not all(isinstance(s, str) and s for s in selectors):
            raise ValueError(f"api must be a service or operation name, or a list of them; got {api!r}")
        with self._lock:
            rates = self._kinds[kind]
            for selector in selectors:
                if rate:
                    rates[selector] = rate
                else:
                    rates.pop(selector, None)
            if seed is not None:
                self._random.seed(seed)

    def fail_writes(
        self,
        rate: float,
        service: str,
        prefix: str,
        side: str | None = None,
        seed: int | None = 0,
        kind: str = UNAVAILABLE,
    ) -> None:
        """Answer ``rate`` (0..1) of ``service``'s (``"s3"``, ``"storage"``) object writes under ``prefix``
        (``bucket/key-prefix``) from ``side`` (``"instance"``, ``"airflow"``, None: both) with ``kind``'s
        error (``WRITE_KINDS``: the API's server error, or its access denied); rate 0 lifts that rule.
        ``seed`` as for ``set``."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1; got {rate!r}")
        if side not in (None, *SIDES):
            raise ValueError(f"side must be one of {SIDES} or None; got {side!r}")
        if kind not in WRITE_KINDS:
            raise ValueError(f"kind must be one of {WRITE_KINDS}; got {kind!r}")
        if not prefix or not isinstance(prefix, str) or "/" not in prefix.lstrip("/"):
            raise ValueError(f"prefix must be 'bucket/key-prefix'; got {prefix!r}")
        with self._lock:
            if rate:
                self._writes[(service, prefix.lstrip("/"), side, kind)] = rate
            else:
                self._writes.pop((service, prefix.lstrip("/"), side, kind), None)
            if seed is not None:
                self._random.seed(seed)

    def clear(self) -> None:
        with self._lock:
            for rates in self._kinds.values():
                rates.clear()
            self._writes.clear()

    def wants_object(self, operation: str) -> bool:
        """Whether ``draw`` needs the object's name for this request (a write while writes fail)."""
        return bool(self._writes) and operation in WRITES

    def draw(self, service: str, operation: str, obj: str | None = None, side: str = "") -> str | None:
        """Draw for one request: the fault it meets (``THROTTLED``, ``UNAVAILABLE``, ``DENIED``) or None.
        One draw per request: a throttling rate of t and an unavailable rate of u fail t and u of them. ``obj``
        (``bucket/key``) and ``side`` (``emulator.calls``: "instance", else the Airflow side) let the
        ``fail_writes`` rules match a write."""
        with self._lock:
            rates = [
                max(table.get(key, 0.0) for key in (ALL, service, operation)) if table else 0.0
                for table in self._kinds.values()
            ]
            if obj and self._writes and operation in WRITES:
                mine = "instance" if side == "instance" else "airflow"
                for (api, prefix, who, kind), rate in self._writes.items():
                    if api == service and obj.startswith(prefix) and who in (None, mine):
                        rates[KINDS.index(kind)] = max(rates[KINDS.index(kind)], rate)
            if not any(rates):
                return None
            drawn = self._random.random()
            for kind, rate in zip(KINDS, rates, strict=True):
                if drawn < rate:
                    return kind
                drawn -= rate
            return None
