"""Console links of a real run (``dag.test()`` on the emulated clouds), read the way Airflow's UI reads
them: from the serialized DAG's links and the XCom they name.

The job waits until the test has seen the instance link in the metadata DB, so a link that only
appears when ``execute`` returns or defers fails the test (the job gives up and the task fails). On
GCE the run also uses ``network``/``subnetwork``/``external_ip=False``: while it runs, the VM the link
names is read back with the real compute client and has that network interface and no access config.
"""

from __future__ import annotations

import json
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import task_states, write_dag, xcom
from waiting import wait_for

from airflow_cloudtrain.emulator import GCP_PROJECT
from airflow_cloudtrain.links.console import ec2_instance_url, folder_url, gce_instance_url

CLOUD = {"aws": "ec2spot", "gcp": "gcspot"}
BUCKET = {"aws": "s3://cloudtrain-emulated/links", "gcp": "gs://cloudtrain-emulated/links"}
REGION = {"aws": "us-east-1", "gcp": "us-central1"}
NETWORK = ", network='train-vpc', subnetwork='train-sub', external_ip=False"


def pushed(dag_id: str, key: str) -> Any:
    """An XCom of the DAG's ``train`` task as stored in the metadata DB (what the UI reads), or None."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.task_id == "train", XComModel.key == key
            )
        )
    while isinstance(value, str) and value[:1] in ('"', "{"):
        value = json.loads(value)
    return value


def ui_links(dag: Any, run: Any) -> dict[str, str]:
    """What the task's page shows: the stored (serialized) operator's links, each reading its XCom."""
    from airflow.serialization.serialized_objects import DagSerialization

    # as the api-server reads it (its DAG bag loads operator links); a scheduler loop run in this
    # worker before (dag.test()) leaves Airflow's class-wide switch off
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DagSerialization, "_load_operator_extra_links", True)
        restored = DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))
    task, ti = restored.get_task("train"), run.get_task_instance("train")
    return {link.name: link.get_link(task, ti_key=ti.key) for link in task.operator_extra_links}


def read_vm(emu: Any, target: dict[str, Any]) -> Any:
    from google.cloud import compute_v1

    from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs

    client = compute_v1.InstancesClient(**compute_client_kwargs(emu.gce_endpoint))
    return client.get(project=GCP_PROJECT, zone=target["zone"], instance=target["instance_id"])


@pytest.mark.parametrize(
    ("provider", "deferrable"),
    [("aws", False), ("gcp", False), ("gcp", True)],
    ids=["ec2", "gce", "gce-deferred"],
)
def test_links_name_the_run_s_instance_and_folder_while_it_runs(
    emu, airflow_db, tmp_path: Path, provider: str, deferrable: bool
) -> None:
    dag_id = f"links_{provider}_{'deferred' if deferrable else 'blocking'}_{uuid.uuid4().hex[:6]}"
    flag = tmp_path / "seen"
    command = (
        f"for i in $(seq 1 1200); do [ -e {flag} ] && break; sleep 0.1; done; [ -e {flag} ] && echo seen"
    )
    extra = NETWORK if provider == "gcp" else ""
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import CloudTrainOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            CloudTrainOperator(task_id="train", cloud={CLOUD[provider]!r}, cpus=2, command={command!r},
                               bucket={BUCKET[provider]!r}, region={REGION[provider]!r}, poll_interval=0.5,
                               deferrable={deferrable}, live_prices=False{extra})
        """
    )
    dag = write_dag(source, dag_id)
    seen: dict[str, Any] = {}

    def watch() -> None:
        try:
            seen["link"] = wait_for(lambda: pushed(dag_id, "_link_CloudInstanceLink"))
            seen["target"] = pushed(dag_id, "cloudtrain_console")
            if provider == "gcp":
                seen["nic"] = read_vm(emu, seen["target"]).network_interfaces[0]
        finally:
            flag.touch()  # let the job end either way

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = dag.test()
    watcher.join(30)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    iid, run_uri, region, zone = result["instance_id"], result["run_uri"], result["region"], result["zone"]

    links = ui_links(dag, run)
    if provider == "aws":
        expected = {
            "Cloud instance": ec2_instance_url(region, iid),
            "Run folder": folder_url(run_uri, region),
        }
    else:
        expected = {
            "Cloud instance": gce_instance_url(GCP_PROJECT, zone, iid),
            "Run folder": folder_url(run_uri, region, GCP_PROJECT),
        }
    assert links == expected
    assert iid in links["Cloud instance"] and run_uri.split("/", 3)[3] in links["Run folder"]
    assert seen["link"] == links["Cloud instance"]  # pushed while the job was still waiting
    if provider == "gcp":
        nic = seen["nic"]
        assert nic.network.endswith("global/networks/train-vpc")
        assert nic.subnetwork.endswith(f"regions/{REGION['gcp']}/subnetworks/train-sub")
        assert list(nic.access_configs) == []  # no external IP


def test_a_gce_group_s_link_names_its_managed_instance_group_while_it_runs(
    emu, airflow_db, tmp_path: Path
) -> None:
    """PreemptibleGroupOperator: the Worker group link while the item runs, and a private template."""
    from google.cloud import compute_v1

    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs
    from airflow_cloudtrain.links.console import mig_url

    dag_id = f"links_group_{uuid.uuid4().hex[:6]}"
    flag = tmp_path / "seen"
    command = f"for i in $(seq 1 1200); do [ -e {flag} ] && break; sleep 0.1; done; [ -e {flag} ]"
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import PreemptibleGroupOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            PreemptibleGroupOperator(task_id="train", cpus=2, command={command!r}, work_items=["a"],
                                     bucket={BUCKET["gcp"]!r}, region="us-central1", poll_interval=0.5,
                                     live_prices=False{NETWORK})
        """
    )
    dag = write_dag(source, dag_id)
    kwargs = compute_client_kwargs(emu.gce_endpoint)
    seen: dict[str, Any] = {}

    def watch() -> None:
        try:
            seen["link"] = wait_for(lambda: pushed(dag_id, "_link_WorkerGroupLink"))
            target = seen["target"] = pushed(dag_id, "cloudtrain_console")
            group = compute_v1.InstanceGroupManagersClient(**kwargs).get(
                project=GCP_PROJECT, zone=target["zone"], instance_group_manager=target["group"]
            )
            template = compute_v1.InstanceTemplatesClient(**kwargs).get(
                project=GCP_PROJECT, instance_template=group.instance_template.rsplit("/", 1)[-1]
            )
            seen["nic"] = template.properties.network_interfaces[0]
        finally:
            flag.touch()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = dag.test()
    watcher.join(30)
    assert task_states(run) == {"train": "success"}
    digest = RunKey(dag_id, "train", run.run_id, -1, BUCKET["gcp"]).digest
    target = seen["target"]
    assert target["group"] == f"ct-{digest}"
    assert seen["link"] == mig_url(GCP_PROJECT, target["zone"], f"ct-{digest}")
    assert ui_links(dag, run) == {
        "Worker group": seen["link"],
        "Run folder": folder_url(xcom(run, "train")["run_uri"], "us-central1", GCP_PROJECT),
    }
    assert seen["nic"].subnetwork.endswith("regions/us-central1/subnetworks/train-sub")
    assert list(seen["nic"].access_configs) == []


def test_a_resumed_run_s_instance_link_follows_the_current_attempt(emu, airflow_db, tmp_path: Path) -> None:
    """CheckpointResumeOperator: after an interruption the button opens the relaunched VM."""
    dag_id = f"links_resume_{uuid.uuid4().hex[:6]}"
    flag = tmp_path / "seen"
    command = f"for i in $(seq 1 1200); do [ -e {flag} ] && break; sleep 0.1; done; [ -e {flag} ]"
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import CheckpointResumeOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            CheckpointResumeOperator(task_id="train", cloud="gcspot", cpus=2, command={command!r},
                                     bucket={BUCKET["gcp"]!r}, region="us-central1", poll_interval=0.5,
                                     live_prices=False)
        """
    )
    dag = write_dag(source, dag_id)
    links: list[str] = []

    def watch() -> None:
        try:
            links.append(wait_for(lambda: pushed(dag_id, "_link_CloudInstanceLink")))
            first = pushed(dag_id, "cloudtrain_console")["instance_id"]
            emu.interrupt(first, notice_s=0)  # gone without a word: the loop relaunches
            link = lambda: pushed(dag_id, "_link_CloudInstanceLink")  # noqa: E731
            links.append(wait_for(lambda: link() != links[0] and link()))  # the relaunched VM's
        finally:
            flag.touch()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = dag.test()
    watcher.join(30)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["interruptions"] == 1 and len(result["attempts"]) == 2
    first, second = (row["instance_id"] for row in result["attempts"])
    assert first in links[0] and second in links[1]
    assert (
        ui_links(dag, run)["Cloud instance"]
        == links[1]
        == gce_instance_url(GCP_PROJECT, result["zone"], second)
    )
