"""InstanceStatusSensor: wait for instances to reach a state, and fail fast when they never can."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, conf

# Importing this module stays cheap (DAG files import it; benchmarks/parse_cost.py): the checks are
# imported by the constructor, the cloud code when the sensor runs.

if TYPE_CHECKING:
    from airflow.sdk import Context

TARGET_STATES = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")


def check_target_state(value: Any) -> None:
    if value not in TARGET_STATES:
        raise ValueError(f"target_state={value!r} is not valid: use one of {', '.join(TARGET_STATES)}")


def check_location(cloud: str, region: Any, zone: Any) -> None:
    from airflow_cloudtrain.operators.checks import check_zone_in_region, parse_region

    parse_region(region, cloud)
    check_zone_in_region(cloud, region, zone)


def check_run_id(value: Any) -> str:
    from airflow_cloudtrain.operators.checks import RUN_ID_RE

    if not isinstance(value, str) or not RUN_ID_RE.fullmatch(value):
        raise ValueError(
            f"run_id={value!r} is not valid: use the run_id of a CloudTrain operator's XCom, e.g. "
            "'ct-0123456789ab' (or a template such as \"{{ ti.xcom_pull('train')['run_id'] }}\")"
        )
    return value


class InstanceStatusSensor(BaseSensorOperator):
    """Wait until every instance in ``instance_ids`` (or every instance of ``run_id``) is in ``target_state``.

    Unlike the Amazon provider's EC2 sensor, which waits forever on an instance that was terminated
    while it waited for "running", this sensor fails at once with the reason. In deferrable mode it
    shares one describe call per poll with every other wait in the triggerer.

    An instance id the cloud does not know fails the sensor naming the id (whatever the target), so
    a typo never passes as "terminated"; ``missing_as_terminated=True`` counts such an id as
    terminated instead (an instance gone for over an hour on EC2, a deleted GCE VM whose delete
    operation has aged out).

    :param cloud: ``ec2``, ``ec2spot``, ``gcloud`` or ``gcspot``: the cloud the instances are on.
    :param target_state: the state to wait for: ``pending``, ``running``, ``stopping``, ``stopped``,
        ``shutting-down`` or ``terminated`` (templated).
    :param instance_ids: EC2 instance ids or GCE VM names, a list (or a template that renders to one);
        give this or ``run_id`` (templated).
    :param run_id: a CloudTrain operator's ``run_id`` (its XCom): waits on every instance of that run;
        give this or ``instance_ids`` (templated).
    :param region: the EC2 region to describe the instances in (None: the connection's); on GCE, the
        zone's region if given (templated).
    :param zone: the GCE zone of the VMs (required on GCE: instances are zonal); no effect on EC2.
    :param aws_conn_id: the Airflow connection for EC2 (None: boto3's own credential chain).
    :param gcp_conn_id: the Airflow connection for GCE.
    :param project_id: the Google Cloud project of the VMs (None: the connection's); GCE only.
    :param deferrable: wait in the triggerer (no worker slot), sharing one describe call per poll
        with every other wait there.
    :param missing_as_terminated: count an id the cloud does not know as terminated instead of
        failing the sensor naming it.
    """

    template_fields: Sequence[str] = ("instance_ids", "run_id", "target_state", "region")

    def __init__(
        self,
        *,
        cloud: str,
        target_state: str = "running",
        instance_ids: list[str] | str | None = None,
        run_id: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        aws_conn_id: str | None = "aws_default",
        gcp_conn_id: str = "google_cloud_default",
        project_id: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        missing_as_terminated: bool = False,
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.contract.clouds import provider
        from airflow_cloudtrain.operators.checks import (
            check_bool,
            is_deferred_value,
            is_templated,
            parse_instance_ids,
            parse_zone,
        )
        from airflow_cloudtrain.operators.launch_config import check_connection_args
        from airflow_cloudtrain.spec import parse_cloud, warn_user

        super().__init__(**kwargs)
        self.missing_as_terminated = check_bool(missing_as_terminated, "missing_as_terminated")
        self.cloud = parse_cloud(cloud)
        check_connection_args(aws_conn_id, gcp_conn_id, project_id, self.cloud)
        if not is_templated(target_state):
            check_target_state(target_state)
        facts = provider(self.cloud)  # where its instances are described: a region (EC2) or a zone (GCE)
        if facts.location == "zone" and not zone and not is_templated(region):
            raise ValueError(
                f"zone={zone!r} is not valid: cloud={self.cloud!r} needs zone= ({facts.compute} instances are "
                "zonal); give the instances' zone, e.g. zone='us-central1-a'"
            )
        if instance_ids in (None, "", [], ()) and run_id in (None, ""):
            raise ValueError(
                "give instance_ids=[...] or run_id=... (the run_id in a CloudTrain operator's XCom)"
            )
        if instance_ids not in (None, "", [], ()) and run_id not in (None, ""):
            raise ValueError(
                f"instance_ids={instance_ids!r} and run_id={run_id!r} were both given: give one "
                "(run_id waits on every instance of that run)"
            )
        # a template stays a string, an XComArg as it is, until rendered (a list would hide it from Jinja)
        if not is_deferred_value(instance_ids) and instance_ids not in (None, "", [], ()):
            instance_ids = parse_instance_ids(instance_ids, self.cloud)
        if run_id not in (None, "") and not is_deferred_value(run_id):
            check_run_id(run_id)
        parse_zone(zone, self.cloud)
        if zone and facts.location == "region":
            warn_user(
                f"zone={zone!r} has no effect on cloud={self.cloud!r}: {facts.compute} instances are described "
                "per region (give region=, or leave both out for the connection's region)"
            )
        if not is_templated(region):
            check_location(self.cloud, region, zone)
        self.instance_ids = instance_ids
        self.run_id = run_id
        self.target_state = target_state
        self.region = region
        self.zone = zone
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.deferrable = check_bool(deferrable, "deferrable")

    @property
    def conn_id(self) -> str | None:
        from airflow_cloudtrain.contract.clouds import conn_id_for

        return conn_id_for(self.cloud, self.aws_conn_id, self.gcp_conn_id)

    def _cloud(self) -> Any:
        from airflow_cloudtrain.clouds.registry import instance_cloud

        return instance_cloud(self.cloud, self.conn_id, self.region, self.zone, self.project_id)

    def _ids(self) -> list[str]:
        from airflow_cloudtrain.operators.checks import parse_instance_ids

        check_target_state(self.target_state)  # the templated fields, rendered by now
        check_location(self.cloud, self.region, self.zone)
        if self.instance_ids:  # a template became a list, or the list's text
            return parse_instance_ids(self.instance_ids, self.cloud)
        check_run_id(self.run_id)
        found = [i.id for i in self._cloud().find_run(self.run_id)]
        if not found:
            raise ValueError(f"no instance of run_id={self.run_id!r} found")
        return found

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):
            return None
        from airflow_cloudtrain.contract.clouds import location_for
        from airflow_cloudtrain.triggers.instances import InstanceStateTrigger

        self.defer(
            trigger=InstanceStateTrigger(
                cloud=self.cloud,
                instance_ids=self._ids(),
                target_state=self.target_state,
                conn_id=self.conn_id,
                region=location_for(self.cloud, self.region, self.zone),
                poll_interval=self.poke_interval,
                project_id=self.project_id,
                missing_as_terminated=self.missing_as_terminated,
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout,
        )

    def poke(self, context: Context) -> bool:
        from airflow.exceptions import AirflowException

        from airflow_cloudtrain.triggers.instances import evaluate_states

        ids = self._ids()
        event = evaluate_states(
            self._cloud().describe(ids), ids, self.target_state, self.missing_as_terminated
        )
        if event is None:
            self.log.info("Waiting for %s to be %s", ids, self.target_state)
            return False
        if event["status"] != "success":
            raise AirflowException(event["message"])
        return True

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        if event.get("status") != "success":
            from airflow.exceptions import AirflowException

            raise AirflowException(event.get("message", f"instances did not reach {self.target_state}"))
        self.log.info("All instances are %s: %s", self.target_state, event.get("states"))
