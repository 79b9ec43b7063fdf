"""The program that runs on the cloud instance: ``python -m airflow_cloudtrain.agent --run-uri URI``.

It reads the run spec from the run folder, runs the setup commands and the job, streams logs and
heartbeats, watches the metadata service for spot / preemption notices, uploads the job's results,
writes the final status and powers the instance off. It is shipped to instances as a zipapp (see
``bootstrap.build_agent_zip``), so this package imports only the stdlib, boto3 (and
google-cloud-storage, lazily), ``airflow_cloudtrain.contract.runs`` and ``airflow_cloudtrain.clouds.registry``
(the cloud names; both stdlib-only); never Airflow. Results go to ``results/<instance-id>/`` of the run
folder, and transient storage errors are retried (``retry``) where losing the call would lose the run.
"""
