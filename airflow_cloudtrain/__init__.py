"""airflow-cloudtrain: run ML training on rented cloud hardware from Apache Airflow.

Importing this package must stay cheap (DAG files import it): no cloud SDK is imported here or in
``operators``/``sensors``; hooks import boto3 and the Google clients inside functions.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The project's own documentation (the README). Airflow's Providers page links a provider's name to its
# ``documentation-url``, else to airflow.apache.org/docs/<package>/, where no page exists for us.
# Airflow 3.3 takes that URL from the package metadata's ``Documentation`` Project-URL (pyproject.toml's
# [project.urls], which must say the same); the key below serves Airflow versions that read it here.
DOCS_URL = "https://github.com/airflow-cloudtrain/airflow-cloudtrain#readme"


def get_provider_info() -> dict[str, Any]:
    """What Airflow's ProvidersManager reads through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-cloudtrain",
        "name": "Cloud Train",
        "description": "Run ML training on rented cloud hardware (EC2, EC2 spot, GCE, GCE spot) and give it back.",
        "versions": [__version__],
        "documentation-url": DOCS_URL,
        "integrations": [
            {
                "integration-name": "Cloud Train",
                "external-doc-url": DOCS_URL,
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "Cloud Train",
                "python-modules": [
                    "airflow_cloudtrain.operators.cloud_train",
                    "airflow_cloudtrain.operators.checkpoint_resume",
                    "airflow_cloudtrain.operators.mlengine_train",
                    "airflow_cloudtrain.operators.spot_fleet",
                    "airflow_cloudtrain.operators.preemptible_group",
                    "airflow_cloudtrain.operators.work_queue",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Cloud Train",
                "python-modules": [
                    "airflow_cloudtrain.sensors.instance_status",
                    "airflow_cloudtrain.sensors.queue_depth",
                ],
            }
        ],
        "hooks": [
            {
                "integration-name": "Cloud Train",
                "python-modules": [
                    "airflow_cloudtrain.hooks.aws",
                    "airflow_cloudtrain.hooks.gcp",
                    "airflow_cloudtrain.hooks.pubsub",
                    "airflow_cloudtrain.hooks.sqs",
                    "airflow_cloudtrain.hooks.vertex",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "Cloud Train",
                "python-modules": [
                    "airflow_cloudtrain.triggers.fleet",
                    "airflow_cloudtrain.triggers.instances",
                    "airflow_cloudtrain.triggers.queue_depth",
                    "airflow_cloudtrain.triggers.run",
                    "airflow_cloudtrain.triggers.vertex_job",
                ],
            }
        ],
        "config": {
            "cloudtrain": {
                "description": "Settings of the Cloud Train provider.",
                "options": {
                    "freeze_triggerer_heap": {
                        "description": (
                            "The first run wait or instance watch in a triggerer process moves its heap "
                            "as it is then (mostly what the triggerer imported) out of the garbage "
                            "collector's full passes (gc.freeze), which otherwise stop the event loop "
                            "for 0.2-0.3 s at 1,000 deferred runs. Reference cycles among those objects "
                            "are then never collected. See airflow_cloudtrain.triggers.heap."
                        ),
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    }
                },
            }
        },
        "extra-links": [
            "airflow_cloudtrain.links.run.CloudInstanceLink",
            "airflow_cloudtrain.links.run.RunFolderLink",
            "airflow_cloudtrain.links.run.WorkerGroupLink",
            "airflow_cloudtrain.links.vertex.VertexJobLink",
        ],
    }
