"""Sensors for instance status and queue depth (cloud SDKs are imported lazily)."""

from airflow_cloudtrain.sensors.instance_status import InstanceStatusSensor
from airflow_cloudtrain.sensors.queue_depth import QueueDepthSensor

__all__ = ["InstanceStatusSensor", "QueueDepthSensor"]
