"""Sensors for instance status and queue depth."""
