"""Operators: mostly configuration over the run folder and the cloud interface."""

from airflow_cloudtrain.operators.checkpoint_resume import CheckpointResumeOperator
from airflow_cloudtrain.operators.cloud_train import CloudTrainOperator

__all__ = ["CheckpointResumeOperator", "CloudTrainOperator"]
