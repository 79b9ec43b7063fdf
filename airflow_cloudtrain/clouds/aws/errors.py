"""EC2's error codes onto the contract's vocabulary (``contract.errors``): capacity, quota, invalid.

One module per provider (``clouds.gcp.errors`` is GCE's), below the modules that call the API, so
that each of them can map what it gets without importing the others.
"""

from __future__ import annotations

from airflow_cloudtrain.contract.errors import CapacityUnavailable, CloudError, InvalidRequest, QuotaExceeded

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "Unsupported",  # the type is not offered in this zone
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",
    }
)
QUOTA_CODES = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"})


def map_client_error(err: Exception) -> Exception:
    """Turn a botocore ClientError into our vocabulary (others pass through unchanged)."""
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return err
    code = response.get("Error", {}).get("Code", "")
    message = response.get("Error", {}).get("Message", str(err))
    if code in CAPACITY_CODES:
        return CapacityUnavailable(message, code)
    if code in QUOTA_CODES:
        return QuotaExceeded(message, code)
    if code.startswith(("Invalid", "Missing", "Unknown")) or code in {"UnauthorizedOperation"}:
        return InvalidRequest(message, code)
    return CloudError(message, code)
