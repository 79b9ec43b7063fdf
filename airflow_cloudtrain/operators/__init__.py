"""Operators: mostly configuration over the run folder and the cloud interface."""

from airflow_cloudtrain.operators.checkpoint_resume import CheckpointResumeOperator
from airflow_cloudtrain.operators.cloud_train import CloudTrainOperator
from airflow_cloudtrain.operators.gc import CloudTrainGcOperator
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
