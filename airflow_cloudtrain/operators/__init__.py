"""Operators: mostly configuration over the run folder and the cloud interface.

``CloudTrainGcOperator`` is imported when it is first asked for (PEP 562): a DAG file that imports the
training operators does not pay for it (``tests/unit/test_parse_cost.py``).
"""

from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.operators.checkpoint_resume import CheckpointResumeOperator
from airflow_cloudtrain.operators.cloud_train import CloudTrainOperator
from airflow_cloudtrain.operators.mlengine_train import MLEngineTrainOperator
from airflow_cloudtrain.operators.preemptible_group import PreemptibleGroupOperator
from airflow_cloudtrain.operators.spot_fleet import SpotFleetOperator

__all__ = [
    "CheckpointResumeOperator",
    "CloudTrainGcOperator",
    "CloudTrainOperator",
    "MLEngineTrainOperator",
    "PreemptibleGroupOperator",
    "SpotFleetOperator",
]

if TYPE_CHECKING:
    from airflow_cloudtrain.operators.gc import CloudTrainGcOperator


def __getattr__(name: str) -> Any:
    if name == "CloudTrainGcOperator":
        from airflow_cloudtrain.operators.gc import CloudTrainGcOperator

        return CloudTrainGcOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
