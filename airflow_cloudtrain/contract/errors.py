"""The small error vocabulary hooks map cloud error codes onto, so policy code never parses strings."""

from __future__ import annotations


class CloudError(Exception):
    """Base class: ``code`` keeps the cloud's own error code for the log."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class CapacityUnavailable(CloudError):
    """The cloud has no capacity for this type in this zone right now: try another offer or zone."""


class QuotaExceeded(CloudError):
    """An account limit stops the launch: another type (another quota) may still work."""


class InvalidRequest(CloudError):
    """The cloud rejected the request itself (unknown type in zone, bad field): do not retry as is."""
