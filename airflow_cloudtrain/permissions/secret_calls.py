"""The calls ``secret_env`` makes, taken from the code instead of the record of a test run.

The record (``tests/data/api_calls.json``) only has the calls some test's run made, and only the
``CloudTrainOperator`` tests read secrets: recorded alone, the other operators' documents would lack
the secret reads their ``secret_env`` needs (and no recorded run reads Secrets Manager at all). So the
generator adds, for every operator whose constructor takes ``secret_env`` (from its signature:
``secret_env_operators``; a new operator cannot be left out) on each provider it runs on (its own
``cloud`` check) and has recorded instances on:

* on the instance side, every read the agent's secret reader can make (``agent.secrets.READS``: SSM
  ``GetParameter``, Secrets Manager ``GetSecretValue``, Secret Manager ``versions.access``), which the
  AWS policy grants on any parameter / secret (``rules.ON_SIDE``: the user's references are unknown
  here; ``cloudtrain permissions --secret`` narrows them to the DAG's and the runs' own names);
* on the Airflow side, the calls that store the run's own copies of ``airflow_*`` values
  (``clouds.aws.secrets.CALLS`` / ``clouds.gcp.secrets.CALLS``), already scoped to
  ``/cloudtrain/*`` on AWS (``rules.BY_NAME``).

And it takes the reads away from the instance side of operators that take no ``secret_env``: a test's
calls are charged to every operator that ran in it, which must not grant a read their instances never
make. Reads the operators' signatures, so needs Airflow (the generator does; the CLI does not).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping

from airflow_cloudtrain.agent.secrets import READS
from airflow_cloudtrain.contract.clouds import CLOUDS
from airflow_cloudtrain.permissions import PROVIDERS

ARGUMENT = "secret_env"


def takes(cls: type, argument: str) -> bool:
    """Does constructing ``cls`` accept ``argument``: its ``__init__`` names it, or passes ``**kwargs``
    on to a base whose ``__init__`` does?"""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters
        if argument in parameters:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return False
    return False


def runs_on(cls: type, provider: str) -> bool:
    """Does the operator accept a cloud of ``provider``? Asks its own ``cloud`` check where it has one
    (``WorkQueueOperator._check_cloud``: ``SpotFleetOperator`` is EC2 only), on a bare instance (the
    check reads no attribute)."""
    check = getattr(cls, "_check_cloud", None)
    if check is None:
        return True
    accepted = []
    for cloud in (c for c, p in CLOUDS.items() if p == provider):
        try:
            check(object.__new__(cls), cloud, None)
        except ValueError:
            continue
        accepted.append(cloud)
    return bool(accepted)


def operators_taking(argument: str) -> dict[str, set[str]]:
    """The documents' operators whose constructor takes ``argument`` -> the providers they run on
    (imports them: Airflow)."""
    from airflow_cloudtrain import permissions

    return {
        cls.__name__: {p for p in PROVIDERS if runs_on(cls, p)}
        for cls in permissions.operator_classes()
        if takes(cls, argument)
    }


def secret_env_operators() -> dict[str, set[str]]:
    """The documents' operators that take ``secret_env`` -> the providers they run on."""
    return operators_taking(ARGUMENT)


def stores(provider: str) -> tuple[tuple[str, str], ...]:
    """(service, operation) of the Airflow side's calls on the run's own secrets."""
    if provider == "aws":
        from airflow_cloudtrain.clouds.aws.secrets import CALLS as AWS_CALLS

        return AWS_CALLS
    from airflow_cloudtrain.clouds.gcp.secrets import CALLS as GCP_CALLS

    return GCP_CALLS


def reads(provider: str) -> list[tuple[str, str]]:
    """(service, operation) of the agent's secret reads on ``provider``."""
    return [(service, op) for cloud, service, op in READS.values() if cloud == provider]


def needed(rows: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The record's calls as the documents grant them: with the secret calls of every operator that
    takes ``secret_env``, without instance-side reads charged to one that does not (there)."""
    calls = [dict(row) for row in rows]
    takers = secret_env_operators()
    all_reads = {(provider, *read) for provider in PROVIDERS for read in reads(provider)}
    out = [
        row
        for row in calls
        if row["provider"] in takers.get(row["operator"], set())
        or row["side"] != "instance"
        or (row["provider"], row["service"], row["operation"]) not in all_reads
    ]
    # where the record shows its instances (a test of two operators charges each with the other's
    # calls: SpotFleetOperator has some on Google Cloud, where it cannot run)
    ran = sorted({(r["operator"], r["provider"]) for r in calls if r["side"] == "instance"})
    for operator, provider in ran:
        if provider not in takers.get(operator, set()):
            continue
        for side, made in (("instance", reads(provider)), ("airflow", stores(provider))):
            out += [
                {"operator": operator, "provider": provider, "side": side, "service": s, "operation": o}
                for s, o in made
            ]
    return out
