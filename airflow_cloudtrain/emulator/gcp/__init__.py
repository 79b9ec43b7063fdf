"""The emulated GCP: the Compute Engine REST server (``gce``: HTTP; ``gce_state``: instances, operations,
faults; ``gce_validate``: the insert rules; ``gce_catalog``: zones and machine types; ``gce_api``: the
API's conventions), Cloud Storage (``gcs``), Pub/Sub and Monitoring's subscription metrics (``pubsub``:
HTTP; ``pubsub_state``: topics, subscriptions, leases), and the GCP half of the instances' side
(``instances``)."""

from __future__ import annotations

from airflow_cloudtrain.emulator.gcp.gce import EMULATOR_USER_AGENT, GceServer, compute_client_kwargs
from airflow_cloudtrain.emulator.gcp.gcs import GcsServer
from airflow_cloudtrain.emulator.gcp.pubsub import PubSubServer, pubsub_client_kwargs

__all__ = [
    "EMULATOR_USER_AGENT",
    "GceServer",
    "GcsServer",
    "PubSubServer",
    "compute_client_kwargs",
    "pubsub_client_kwargs",
]
