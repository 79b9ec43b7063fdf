"""A SpotFleetOperator (and PreemptibleGroupOperator) worker killed at each step (SIGKILL: no cleanup code runs), then the task retried.

Try 1 runs ``dag.test()`` in a subprocess that kills itself right after the queues exist, right after
the group exists, or in the middle of the sweep (two items done); try 2 runs the same DAG run here.
The retry must re-attach (exactly one group ever created), every item must have exactly one result,
and after the task nothing of the run may exist: queues, group, launch template, instances.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from dag_helpers import fleet_nothing_left as nothing_left
from dag_helpers import gce_fleet_nothing_left, load_example, start_first_try, task_states, write_dag, xcom
from test_spot_fleet import BUCKET

from airflow_cloudtrain.contract.runs import RunKey, join
from airflow_cloudtrain.storage import open_run_folder

JOBS = str(Path(__file__).parent / "jobs")
STEPS = ["queue_created", "group_created", "mid_sweep"]

DAG_SOURCE = """
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.lifecycle.fleet.run import FleetRun
from airflow_cloudtrain.operators import SpotFleetOperator

DIE_AT = os.environ.get("CLOUDTRAIN_TEST_DIE_AT")  # set only in the process that plays the dying worker


def die(step):
    if DIE_AT == step:
        os.kill(os.getpid(), signal.SIGKILL)


class DyingFleet(FleetRun):
    def _queues(self):
        queues = super()._queues()
        die("queue_created")  # the work queue and its dead-letter queue exist, nothing else yet
        return queues

    def _group(self, plan):
        super()._group(plan)
        die("group_created")


class DyingFleetOperator(SpotFleetOperator):
    def _new_fleet(self, context):
        fleet = super()._new_fleet(context)
        fleet.__class__ = DyingFleet
        return fleet

    def new_engine(self, context):
        engine = super().new_engine(context)
        watch_of = engine.watch

        def watch(handle):
            watch = watch_of(handle)
            if not getattr(watch, "dying", False):
                poll = watch.poll

                def poll_then_die():
                    done = poll()
                    if len(watch.outcomes) >= 2:
                        die("mid_sweep")
                    return done

                watch.poll, watch.dying = poll_then_die, True
            return watch

        engine.watch = watch
        return engine


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    DyingFleetOperator(
        task_id="sweep", cloud="ec2spot", cpus=2, ram="4g", code="{jobs}", command="python3 item.py",
        bucket="{bucket}", region="us-east-1", poll_interval=0.5, live_prices=False, lease_timeout=10,
        num_workers=1, max_workers=3, work_items=[{{"steps": 6, "step_s": 0.2, "n": n}} for n in range(6)])
"""


@pytest.mark.parametrize("step", STEPS)
def test_fleet_worker_killed_at_each_step_leaves_one_group_and_nothing_after(
    emu, airflow_db, step: str
) -> None:
    dag_id = f"fleet_killed_{step}"
    write_dag(DAG_SOURCE.format(dag_id=dag_id, jobs=JOBS, bucket=BUCKET), dag_id)
    when = datetime(2026, 2, 1, tzinfo=timezone.utc) + timedelta(hours=STEPS.index(step))
    emu.reset_counts()
    proc = start_first_try(dag_id, when, {"CLOUDTRAIN_TEST_DIE_AT": step})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -9, f"try 1 did not die at {step}: rc={proc.returncode}\n{err[-3000:]}"

    run = load_example(dag_id).test(logical_date=when, run_after=when)
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    counts = emu.request_counts()
    assert counts.get("CreateAutoScalingGroup", 0) == 1  # the retry re-attached to try 1's group
    assert counts.get("CreateLaunchTemplate", 0) <= 1
    assert (
        result["items_succeeded"] == 6 and result["items_failed"] == [] and result["items_duplicated"] == []
    )
    folder = open_run_folder(join(BUCKET, RunKey(dag_id, "sweep", run.run_id, -1, BUCKET).path()))
    for n, item in enumerate(result["items"]):
        output = json.loads(folder.get_text(item["results_uri"].split(folder.uri + "/", 1)[1] + "/item.json"))
        assert output["item"]["n"] == n
    nothing_left(RunKey(dag_id, "sweep", run.run_id, -1, BUCKET).digest)


GCE_BUCKET = "gs://cloudtrain-emulated/fleet"
GCE_DAG_SOURCE = """
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.lifecycle.fleet.run import FleetRun
from airflow_cloudtrain.operators import PreemptibleGroupOperator

DIE_AT = os.environ.get("CLOUDTRAIN_TEST_DIE_AT")


def die(step):
    if DIE_AT == step:
        os.kill(os.getpid(), signal.SIGKILL)


class DyingGroup(FleetRun):
    def _queues(self):
        queues = super()._queues()
        die("queue_created")  # topics and subscriptions exist, nothing else yet
        return queues

    def _group(self, plan):
        super()._group(plan)
        die("group_created")


class DyingGroupOperator(PreemptibleGroupOperator):
    def _new_fleet(self, context):
        fleet = super()._new_fleet(context)
        fleet.__class__ = DyingGroup
        return fleet

    def new_engine(self, context):
        engine = super().new_engine(context)
        watch_of = engine.watch

        def watch(handle):
            watch = watch_of(handle)
            if not getattr(watch, "dying", False):
                poll = watch.poll

                def poll_then_die():
                    done = poll()
                    if len(watch.outcomes) >= 2:
                        die("mid_sweep")
                    return done

                watch.poll, watch.dying = poll_then_die, True
            return watch

        engine.watch = watch
        return engine


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    DyingGroupOperator(
        task_id="sweep", cpus=2, ram="4g", code="{jobs}", command="python3 item.py", bucket="{bucket}",
        region="us-central1", poll_interval=0.5, live_prices=False, lease_timeout=10, num_workers=2,
        work_items=[{{"steps": 6, "step_s": 0.2, "n": n}} for n in range(6)])
"""


# queue_created and group_created find the queues and the group by the provider's own calls: both
# clouds keep them. mid_sweep adds the sweep's progress (the run folder's results, provider-neutral)
# to what group_created already finds: kept on EC2 (the SpotFleetOperator case), GCE in ``make faults``.
@pytest.mark.parametrize("step", [*STEPS[:2], pytest.param("mid_sweep", marks=pytest.mark.faults)])
def test_group_worker_killed_at_each_step_leaves_one_group_and_nothing_after(
    emu, airflow_db, step: str
) -> None:
    dag_id = f"gce_group_killed_{step}"
    write_dag(GCE_DAG_SOURCE.format(dag_id=dag_id, jobs=JOBS, bucket=GCE_BUCKET), dag_id)
    when = datetime(2026, 3, 1, tzinfo=timezone.utc) + timedelta(hours=STEPS.index(step))
    emu.reset_counts()
    proc = start_first_try(dag_id, when, {"CLOUDTRAIN_TEST_DIE_AT": step})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -9, f"try 1 did not die at {step}: rc={proc.returncode}\n{err[-3000:]}"

    run = load_example(dag_id).test(logical_date=when, run_after=when)
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    counts = emu.request_counts()
    assert counts.get("instanceGroupManagers.insert", 0) == 1  # the retry re-attached to try 1's group
    assert counts.get("instanceTemplates.insert", 0) <= 1
    assert counts.get("topics.create", 0) <= 2 and counts.get("subscriptions.create", 0) <= 2
    assert result["items_succeeded"] == 6 and result["items_failed"] == []
    assert result["items_duplicated"] == []
    for n, item in enumerate(result["items"]):
        output = json.loads(open_run_folder(item["results_uri"]).get_text("item.json"))
        assert output["item"]["n"] == n
    gce_fleet_nothing_left(emu, RunKey(dag_id, "sweep", run.run_id, -1, GCE_BUCKET).digest)
