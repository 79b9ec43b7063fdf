"""Sensors for instance status and queue depth (cloud SDKs are imported lazily)."""

from airflow_cloudtrain.sensors.instance_status import InstanceStatusSensor

__all__ = ["InstanceStatusSensor"]
