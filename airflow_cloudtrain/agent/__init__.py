"""The program that runs on the cloud instance: ``python -m airflow_cloudtrain.agent --run-uri URI``.

It reads the run spec from the run folder, runs the setup commands and the job, streams logs and
heartbeats, watches the metadata service for spot / preemption notices, uploads the job's results,
writes the final status and powers the instance off. It is shipped to instances as a zipapp (see
``bootstrap.build_agent_zip``), so this package imports only the stdlib, boto3 (and
google-cloud-storage, lazily) and ``airflow_cloudtrain.runs``; never Airflow.
"""
