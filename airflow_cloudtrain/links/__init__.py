"""Operator extra links: buttons on a task's page that open what the task made in the cloud console."""

from airflow_cloudtrain.links.run import CloudInstanceLink, RunFolderLink, WorkerGroupLink
from airflow_cloudtrain.links.vertex import VertexJobLink

__all__ = ["CloudInstanceLink", "RunFolderLink", "VertexJobLink", "WorkerGroupLink"]
