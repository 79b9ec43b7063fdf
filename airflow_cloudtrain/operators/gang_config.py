"""A gang's arguments (``num_nodes``, ``placement``, ``log_nodes``), checked at DAG parse time.

``num_nodes`` runs one job over that many instances of one offer in one zone (``lifecycle.run.gang``).
The upper bound guards against a typo renting a hundred GPU machines: 64 unless the deployment raises
``[cloudtrain] max_num_nodes`` in its Airflow configuration (read when the operator is constructed).
A templated ``num_nodes`` (``"{{ params.nodes }}"``) is checked again once rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.operators.checks import is_deferred_value

DEFAULT_MAX_NUM_NODES = 64
HEAD_ONLY_ABOVE = 8  # log_nodes defaults to "all" up to this many nodes, "head" above
LOG_NODES = ("all", "head")


@dataclass(frozen=True)
class GangArgs:
    """The checked gang arguments of one task (``num_nodes`` 1: no gang)."""

    num_nodes: int = 1
    placement: str | None = None
    log_nodes: str = "all"


def max_num_nodes() -> int:
    """``[cloudtrain] max_num_nodes`` (default 64), as the deployment configured it."""
    from airflow.sdk import conf

    raw = conf.get("cloudtrain", "max_num_nodes", fallback=str(DEFAULT_MAX_NUM_NODES))
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(
            f"[cloudtrain] max_num_nodes={raw!r} in the Airflow configuration is not valid: use a whole number"
        ) from None
    return max(1, value)


def parse_num_nodes(value: Any) -> int:
    """A whole number of nodes >= 1 (an int, or its digits as a rendered template gives them)."""
    forms = "use a whole number of instances, at least 1 (e.g. num_nodes=4)"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"num_nodes={value!r} is not valid: {forms}")
    if value < 1:
        raise ValueError(f"num_nodes={value!r} is not valid: {forms}")
    limit = max_num_nodes()
    if value > limit:
        raise ValueError(
            f"num_nodes={value!r} is above the limit of {limit} nodes: use at most {limit}, or raise the "
            "limit with the Airflow configuration option [cloudtrain] max_num_nodes "
            "(AIRFLOW__CLOUDTRAIN__MAX_NUM_NODES)"
        )
    return value


def parse_log_nodes(value: Any, num_nodes: int) -> str:
    """Whose job log streams into the task log: every node's (``"all"``) or the head's (``"head"``);
    None: all up to 8 nodes, the head's above (a task log of 64 interleaved logs is unreadable)."""
    if value is None:
        return "all" if num_nodes <= HEAD_ONLY_ABOVE else "head"
    if value not in LOG_NODES:
        raise ValueError(
            f"log_nodes={value!r} is not valid: use 'all' (every node's log, prefixed [rank N]) or "
            f"'head' (rank 0's only); the default is 'all' up to {HEAD_ONLY_ABOVE} nodes, 'head' above"
        )
    return str(value)


def parse_gang_args(
    num_nodes: Any, placement: Any, log_nodes: Any, cloud: Any, instance_type: Any
) -> GangArgs | None:
    """The checked arguments; None while ``num_nodes`` is a template (checked again once rendered).
    ``placement="cluster"`` is checked against ``instance_type`` when both are known."""
    from airflow_cloudtrain.catalog.rules import check_placement

    if is_deferred_value(num_nodes):
        if log_nodes is not None:
            parse_log_nodes(log_nodes, 1)
        check_placement(placement, "ec2", None)
        return None
    from airflow_cloudtrain.contract.clouds import CLOUDS

    nodes = parse_num_nodes(num_nodes)
    logs = parse_log_nodes(log_nodes, nodes)
    known = isinstance(cloud, str) and not is_deferred_value(cloud) and cloud.strip().lower() in CLOUDS
    itype = instance_type if isinstance(instance_type, str) and not is_deferred_value(instance_type) else None
    if known:
        check_placement(placement, cloud.strip().lower(), itype)
    else:  # the family is checked once the cloud is rendered
        check_placement(placement, "ec2", None)
    return GangArgs(nodes, placement, logs)


def refuse_num_nodes(operator: str, kwargs: dict[str, Any]) -> None:
    """The work-queue fleets run independent workers: ``num_nodes`` there is a mistake for ``num_workers``."""
    for name in ("num_nodes", "placement", "log_nodes"):
        if name in kwargs:
            raise ValueError(
                f"{name}={kwargs[name]!r} is not valid on {operator}: its instances are independent workers "
                "of a work queue, not one job's nodes; use num_workers= for how many run at once "
                "(num_nodes is for CloudTrainOperator and CheckpointResumeOperator)"
            )
