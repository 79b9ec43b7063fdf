"""The live catalog's calls, taken from the code instead of the record of a test run.

Every operator that takes ``live_prices`` refreshes its region's catalog before it chooses an offer
(``catalog.live`` on AWS, ``catalog.live_gcp`` on Google Cloud), unless a fresh cache answers. The
cache is shared by every run on a machine, and by every test of a suite's worker, so which operator's
run made the refresh in a recording depends on the order the tests ran in: recorded alone, an
operator's document can lack the refresh (``CheckpointResumeOperator`` on Google Cloud lacked
``compute.machineTypes.list`` and ``compute.acceleratorTypes.list``: a cold cache's refresh would have
been refused). So the generator adds the refresh's calls (``catalog.live.CALLS``,
``catalog.live_gcp.CALLS``) to the Airflow side of every operator whose constructor takes
``live_prices`` (its signature, as ``secret_calls`` reads ``secret_env``), on each provider it runs on
and has recorded Airflow-side calls on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from airflow_cloudtrain.permissions.secret_calls import operators_taking

ARGUMENT = "live_prices"


def refresh_calls(provider: str) -> tuple[tuple[str, str], ...]:
    """(service, operation) of a catalog refresh on ``provider``."""
    if provider == "aws":
        from airflow_cloudtrain.catalog.live import CALLS as AWS_CALLS

        return AWS_CALLS
    from airflow_cloudtrain.catalog.live_gcp import CALLS as GCP_CALLS

    return GCP_CALLS


def refreshing_operators() -> dict[str, set[str]]:
    """The documents' operators that take ``live_prices`` -> the providers they run on."""
    return operators_taking(ARGUMENT)


def needed(rows: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The record's calls with a catalog refresh's calls on the Airflow side of every operator that
    refreshes, where the record shows it ran on that provider."""
    out = [dict(row) for row in rows]
    takers = refreshing_operators()
    ran = sorted({(r["operator"], r["provider"]) for r in out if r["side"] == "airflow"})
    for operator, provider in ran:
        if provider in takers.get(operator, set()):
            out += [
                {"operator": operator, "provider": provider, "side": "airflow", "service": s, "operation": o}
                for s, o in refresh_calls(provider)
            ]
    return out
