"""Compute Engine's error codes onto the contract's vocabulary (``contract.errors``).

Below ``gce`` (instances), ``firewall`` and ``fleet`` (groups), which all map what the API returns;
``clouds.aws.errors`` is EC2's.
"""

from __future__ import annotations

from airflow_cloudtrain.contract.errors import CapacityUnavailable, CloudError, InvalidRequest, QuotaExceeded

CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "UNSUPPORTED_OPERATION",
    }
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})


def map_code(code: str, message: str) -> CloudError:
    if code in CAPACITY_CODES:
        return CapacityUnavailable(message, code)
    if code in QUOTA_CODES:
        return QuotaExceeded(message, code)
    return InvalidRequest(message, code)


def map_api_error(err: Exception) -> Exception:
    """google.api_core errors (HTTP) onto our vocabulary."""
    reason = ""
    for detail in getattr(err, "errors", None) or []:
        reason = detail.get("reason", "") if isinstance(detail, dict) else getattr(detail, "reason", "")
        break
    code = getattr(err, "code", 0)
    if reason in QUOTA_CODES or "quota" in reason.lower():
        return QuotaExceeded(str(err), reason or "QUOTA_EXCEEDED")
    if code in (400, 404, 409):
        return InvalidRequest(str(err), reason or str(code))
    return err
