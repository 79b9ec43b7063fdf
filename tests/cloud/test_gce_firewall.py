"""A GCE run's VMs are unreachable from outside: the run's deny rule exists while the run lives, every VM
carries its tag, and the rule is gone after success, failure, a kill halfway, and with the group of a
PreemptibleGroupOperator; ``ssh_source_ranges`` adds the SSH allow rule. Read back with the real
``compute_v1`` clients, as a user would check in the console; the emulator's firewall API itself is
checked first (what the real API accepts and refuses)."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import gce_fleet_nothing_left, task_states, write_dag, xcom
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.emulator import GCP_PROJECT
from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs

BUCKET = "gs://cloudtrain-emulated/firewall"
JOBS = str(Path(__file__).parent / "jobs")


def firewalls(emu: Any) -> Any:
    return compute_v1.FirewallsClient(**compute_client_kwargs(emu.gce_endpoint))


def rules_of(emu: Any, digest: str) -> dict[str, Any]:
    """The run's rules by name, listed as a user would (``gcloud compute firewall-rules list``)."""
    return {r.name: r for r in firewalls(emu).list(project=GCP_PROJECT) if r.name.startswith(f"ct-{digest}-")}


def vm_tags(emu: Any, zone: str, name: str) -> list[str]:
    client = compute_v1.InstancesClient(**compute_client_kwargs(emu.gce_endpoint))
    return list(client.get(project=GCP_PROJECT, zone=zone, instance=name).tags.items)


def insert(emu: Any, **body: Any) -> None:
    base = {
        "name": f"fw-{uuid.uuid4().hex[:8]}",
        "target_tags": ["ct-x"],
        "denied": [{"I_p_protocol": "all"}],
    }
    firewalls(emu).insert(project=GCP_PROJECT, firewall_resource=compute_v1.Firewall({**base, **body}))


# --- the emulator's firewall API ------------------------------------------------------------------


def test_a_rule_is_created_read_listed_and_deleted(emu) -> None:
    client, name = firewalls(emu), f"fw-{uuid.uuid4().hex[:8]}"
    insert(emu, name=name, source_ranges=["0.0.0.0/0"], priority=1000)
    got = client.get(project=GCP_PROJECT, firewall=name)
    assert (got.priority, got.direction, list(got.target_tags), got.denied[0].I_p_protocol) == (
        1000,
        "INGRESS",
        ["ct-x"],
        "all",
    )
    assert got.network.endswith(f"projects/{GCP_PROJECT}/global/networks/default")
    listed = client.list(
        request=compute_v1.ListFirewallsRequest(project=GCP_PROJECT, filter=f"name = {name}")
    )
    assert [r.name for r in listed] == [name]
    with pytest.raises(gexc.Conflict):
        insert(emu, name=name)
    client.delete(project=GCP_PROJECT, firewall=name)
    with pytest.raises(gexc.NotFound):
        client.get(project=GCP_PROJECT, firewall=name)
    with pytest.raises(gexc.NotFound):
        client.delete(project=GCP_PROJECT, firewall=name)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"priority": 65536}, "resource.priority"),
        ({"allowed": [{"I_p_protocol": "tcp", "ports": ["22"]}]}, "either allowed or denied"),
        ({"denied": []}, "resource.allowed"),
        ({"direction": "SIDEWAYS"}, "resource.direction"),
        ({"source_ranges": ["0.0.0.0/0", "::/0"]}, "IPv4 or IPv6 ranges, not both"),
        ({"source_ranges": ["10.0.0.0/33"]}, "resource.sourceRanges[0]"),
        ({"target_tags": ["Not_A_Tag"]}, "resource.targetTags[0]"),
        ({"name": "1-bad"}, "resource.name"),
        ({"network": "projects/other-project/global/networks/default"}, "Cross project"),
        ({"denied": [{"I_p_protocol": "icmp", "ports": ["22"]}]}, "tcp, udp or sctp"),
    ],
)
def test_the_api_refuses_what_gce_refuses(emu, body: dict[str, Any], words: str) -> None:
    with pytest.raises(gexc.BadRequest, match=words.replace("[", r"\[").replace("(", r"\(")):
        insert(emu, **body)


def test_an_instance_s_network_tags_are_checked_and_shown(emu) -> None:
    client = compute_v1.InstancesClient(**compute_client_kwargs(emu.gce_endpoint))
    base = {
        "machine_type": "zones/us-central1-a/machineTypes/n1-standard-4",
        "disks": [
            {
                "boot": True,
                "auto_delete": True,
                "initialize_params": {
                    "disk_size_gb": 10,
                    "source_image": "projects/debian-cloud/global/images/family/debian-12",
                },
            }
        ],
    }
    with pytest.raises(gexc.BadRequest, match=r"tags.items\[0\]"):
        client.insert(
            project=GCP_PROJECT,
            zone="us-central1-a",
            instance_resource=compute_v1.Instance({**base, "name": "tagged-bad", "tags": {"items": ["No!"]}}),
        )
    client.insert(
        project=GCP_PROJECT,
        zone="us-central1-a",
        instance_resource=compute_v1.Instance({**base, "name": "tagged", "tags": {"items": ["ct-a", "web"]}}),
    )
    try:
        assert vm_tags(emu, "us-central1-a", "tagged") == ["ct-a", "web"]
    finally:
        client.delete(project=GCP_PROJECT, zone="us-central1-a", instance="tagged")


# --- single runs inside Airflow -------------------------------------------------------------------

# the job holds until the test has looked at the live run (no race with a loaded machine), then ends
HOLD = "echo started; while [ ! -f {release} ]; do sleep 0.1; done; exit {code}"


def run_dag(dag_id: str, command: str, extra: str = "", preamble: str = "") -> Any:
    source = textwrap.dedent(
        """
        import os, signal, time
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import CloudTrainOperator
        """
    )
    source += textwrap.dedent(preamble)
    source += textwrap.dedent(
        f"""
        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            Op = globals().get("KilledOperator", CloudTrainOperator)
            Op(task_id="train", cloud="gcspot", cpus=2, ram="4g", command={command!r}, bucket={BUCKET!r},
               region="us-central1", poll_interval=0.5, live_prices=False {extra})
        """
    )
    return write_dag(source, dag_id)


def digest_of(dag_id: str, run: Any) -> str:
    return RunKey(dag_id, "train", run.run_id, -1, BUCKET).digest


def while_running(emu: Any, act: Any, timeout: float = 240) -> tuple[threading.Thread, dict[str, Any]]:
    """In the background: once a VM of ours runs its job, ``act(instance)``; what it returns is kept."""
    seen: dict[str, Any] = {}

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for inst in emu.running_instances():
                if "started" in emu.agent_log(inst["id"]):
                    try:
                        seen.update(act(inst))
                    except Exception as err:  # reported by the test's assertions
                        seen["error"] = repr(err)
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


def look(emu: Any, release: Path | None = None) -> Any:
    def act(inst: dict[str, Any]) -> dict[str, Any]:
        from airflow_cloudtrain.contract.runs import TAG_RUN_KEY

        digest = emu.gce.instance(inst["zone"], inst["id"])["labels"][TAG_RUN_KEY]
        out = {
            "digest": digest,
            "tags": vm_tags(emu, inst["zone"], inst["id"]),
            "rules": rules_of(emu, digest),
        }
        if release is not None:
            release.touch()
        return out

    return act


@pytest.mark.parametrize(("code", "state"), [(0, "success"), (3, "failed")])
def test_the_rule_lives_with_the_run_and_goes_after_it(
    emu, airflow_db, tmp_path, code: int, state: str
) -> None:
    dag_id = f"firewall_run_{state}"
    release = tmp_path / "release"
    watcher, seen = while_running(emu, look(emu, release))
    run = run_dag(dag_id, HOLD.format(release=release, code=code)).test()
    watcher.join(5)
    assert task_states(run) == {"train": state}
    digest = digest_of(dag_id, run)
    assert seen.get("digest") == digest, seen
    assert seen["tags"] == [f"ct-{digest}"]
    (deny,) = seen["rules"].values()  # no SSH rule unless asked
    assert deny.name == f"ct-{digest}-deny" and list(deny.target_tags) == [f"ct-{digest}"]
    assert (deny.priority, deny.direction, list(deny.source_ranges)) == (1000, "INGRESS", ["0.0.0.0/0"])
    assert [d.I_p_protocol for d in deny.denied] == ["all"] and not deny.allowed
    assert rules_of(emu, digest) == {}


def test_ssh_source_ranges_add_an_allow_rule_above_the_deny(emu, airflow_db, tmp_path) -> None:
    dag_id = "firewall_run_ssh"
    release = tmp_path / "release"
    watcher, seen = while_running(emu, look(emu, release))
    extra = ', ssh_source_ranges=["203.0.113.0/24", "2001:db8::/32"]'
    run = run_dag(dag_id, HOLD.format(release=release, code=0), extra).test()
    watcher.join(5)
    assert task_states(run) == {"train": "success"}
    digest = digest_of(dag_id, run)
    rules = seen["rules"]
    assert sorted(rules) == [f"ct-{digest}-deny", f"ct-{digest}-ssh", f"ct-{digest}-ssh6"], seen
    ssh, ssh6, deny = rules[f"ct-{digest}-ssh"], rules[f"ct-{digest}-ssh6"], rules[f"ct-{digest}-deny"]
    assert ssh.priority == ssh6.priority < deny.priority  # lower wins: SSH from these ranges gets in
    assert (list(ssh.source_ranges), list(ssh6.source_ranges)) == (["203.0.113.0/24"], ["2001:db8::/32"])
    assert [(a.I_p_protocol, list(a.ports)) for a in ssh.allowed] == [("tcp", ["22"])]
    assert list(ssh.target_tags) == [f"ct-{digest}"]
    assert rules_of(emu, digest) == {}


def test_a_killed_run_leaves_no_rule(emu, airflow_db) -> None:
    """SIGTERM while the job runs: ``on_kill`` releases the VM and then the rule."""
    dag_id = "firewall_killed"
    before = signal.getsignal(signal.SIGTERM)
    try:
        watcher, seen = while_running(emu, lambda inst: (os.kill(os.getpid(), signal.SIGTERM), {})[1])
        run = run_dag(dag_id, HOLD.format(release="/nonexistent/never", code=0)).test()
        watcher.join(5)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert task_states(run) == {"train": "failed"}
    digest = digest_of(dag_id, run)
    assert rules_of(emu, digest) == {}
    assert [i for i in emu.gce.alive() if i["labels"].get("cloudtrain-run-key") == digest] == []


KILLED_AFTER_RULE = """
from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt, RunContext


class KilledAfterRule(RunAttempt):
    def _protect_network(self):
        super()._protect_network()  # the rule exists; no VM yet
        os.kill(os.getpid(), signal.SIGTERM)  # Airflow's kill: on_kill runs in this thread, now
        time.sleep(2)


class KilledOperator(CloudTrainOperator):
    def _new_attempt(self, context):
        ctx = RunContext.for_task(self._config(), self, context, self.launch_options, self.wait)
        self._attempt = KilledAfterRule(ctx)
        return self._attempt
"""


def test_a_kill_between_the_rule_and_the_launch_leaves_nothing(emu, airflow_db, capfd) -> None:
    dag_id = "firewall_killed_before_launch"
    before = signal.getsignal(signal.SIGTERM)
    emu.reset_counts()
    try:
        run = run_dag(dag_id, "echo never", preamble=KILLED_AFTER_RULE).test()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert task_states(run) == {"train": "failed"}
    counts = emu.gce.counts()
    assert counts.get("firewalls.insert") == 1 and counts.get("instances.insert", 0) == 0, counts
    assert rules_of(emu, digest_of(dag_id, run)) == {}
    assert "Released firewall" in capfd.readouterr().out


# --- the ledger: a retry adopts the rule, a lost store still finds it -----------------------------


def test_a_retry_adopts_the_rule_and_a_ledger_without_its_store_finds_it(emu) -> None:
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.lifecycle.prepare import LaunchOptions

    digest = uuid.uuid4().hex[:20]
    backend = GcpRunBackend("google_cloud_default", None, "us-central1")
    options = LaunchOptions(ssh_source_ranges=["198.51.100.0/24"])
    emu.reset_counts()
    for _ in range(2):  # the second try finds both rules and makes nothing
        ledger = ResourceLedger(digest)
        backend.protect_network(ledger, digest, options, lambda: None, None)
        assert sorted(e.id for e in ledger.of_kind("firewall")) == [f"ct-{digest}-deny", f"ct-{digest}-ssh"]
    assert emu.gce.counts().get("firewalls.insert") == 2  # one per rule, once
    lost = ResourceLedger(digest)  # a trigger's on_kill: no store, only the run key
    released = lost.release(backend)
    assert sorted(r.id for r in released) == [f"ct-{digest}-deny", f"ct-{digest}-ssh"]
    assert rules_of(emu, digest) == {}


# --- a group of workers ---------------------------------------------------------------------------


def test_group_workers_carry_the_tag_and_the_rule_goes_with_the_group(emu, airflow_db, tmp_path) -> None:
    dag_id = "firewall_group"
    release = tmp_path / "release"
    items = [{"steps": 2, "step_s": 0.1, "hold_at": 1, "release": str(release)} for _ in range(2)]
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import PreemptibleGroupOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            PreemptibleGroupOperator(
                task_id="sweep", cpus=2, ram="4g", code={JOBS!r}, command="python3 item.py",
                bucket={BUCKET!r}, region="us-central1", work_items={items!r}, poll_interval=0.5,
                live_prices=False, lease_timeout=10, num_workers=2)
        """
    )
    seen: dict[str, Any] = {}

    def watch() -> None:
        try:
            look_at_group(time.monotonic() + 240)
        finally:
            release.touch()  # never leave the items held

    def look_at_group(deadline: float) -> None:
        from airflow_cloudtrain.contract.runs import TAG_RUN_KEY

        while time.monotonic() < deadline and not release.exists():
            members = [i for i in emu.running_instances() if i.get("group")]
            if len(members) == 2 and any("holding" in emu.agent_log(i["id"]) for i in members):
                seen["digest"] = emu.gce.instance(members[0]["zone"], members[0]["id"])["labels"][TAG_RUN_KEY]
                seen["tags"] = [vm_tags(emu, i["zone"], i["id"]) for i in members]
                seen["rules"] = sorted(rules_of(emu, seen["digest"]))
                seen["template"] = list(
                    compute_v1.InstanceTemplatesClient(**compute_client_kwargs(emu.gce_endpoint))
                    .get(project=GCP_PROJECT, instance_template=f"ct-{seen['digest']}")
                    .properties.tags.items
                )
                release.touch()
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = write_dag(source, dag_id).test()
    watcher.join(5)
    assert task_states(run) == {"sweep": "success"}, xcom(run, "sweep")
    digest = RunKey(dag_id, "sweep", run.run_id, -1, BUCKET).digest
    assert seen.get("digest") == digest, seen
    assert seen["tags"] == [[f"ct-{digest}"]] * 2 and seen["template"] == [f"ct-{digest}"]
    assert seen["rules"] == [f"ct-{digest}-deny"]
    gce_fleet_nothing_left(emu, digest)
    assert rules_of(emu, digest) == {}


def test_each_resume_attempt_has_the_rule_and_none_is_left(emu, airflow_db, tmp_path) -> None:
    """CheckpointResumeOperator: the ledger releases everything at each attempt's end, so the rule is
    made per attempt (same name) and deleted with its VM; a preempted attempt's VM too."""
    dag_id = "firewall_resume"
    release = tmp_path / "release"
    seen: list[dict[str, Any]] = []

    def watch() -> None:
        done: set[str] = set()
        deadline = time.monotonic() + 300
        try:
            while len(seen) < 2 and time.monotonic() < deadline:
                for inst in emu.running_instances():
                    if inst["id"] not in done and "started" in emu.agent_log(inst["id"]):
                        done.add(inst["id"])
                        seen.append({**look(emu)(inst), "id": inst["id"]})
                        if len(seen) == 1:
                            emu.interrupt(inst["id"], notice_s=0)  # preempted: the loop relaunches
                time.sleep(0.2)
        finally:
            release.touch()  # the second attempt's job ends (never left holding)

    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import CheckpointResumeOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            CheckpointResumeOperator(
                task_id="train", cloud="gcspot", cpus=2, ram="4g", bucket={BUCKET!r}, region="us-central1",
                command={HOLD.format(release=release, code=0)!r}, poll_interval=0.5, live_prices=False)
        """
    )
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    emu.reset_counts()
    run = write_dag(source, dag_id).test()
    watcher.join(5)
    assert task_states(run) == {"train": "success"}
    digest = digest_of(dag_id, run)
    assert [s["digest"] for s in seen] == [digest, digest], seen
    # a resumed attempt makes the rule again: not a replay of the first create's requestId (the
    # real API would answer with the old operation and make nothing)
    assert [sorted(s["rules"]) for s in seen] == [[f"ct-{digest}-deny"]] * 2, seen
    assert [s["tags"] for s in seen] == [[f"ct-{digest}"]] * 2
    counts = emu.gce.counts()
    assert counts.get("firewalls.insert") == counts.get("firewalls.delete") == 2, counts
    assert rules_of(emu, digest) == {}


@pytest.mark.parametrize(
    ("kw", "network"),
    [
        ({}, "global/networks/default"),
        ({"network": f"projects/{GCP_PROJECT}/global/networks/train-vpc"}, "global/networks/train-vpc"),
        ({"network": "global/networks/train-vpc", "subnetwork": "s1"}, "global/networks/train-vpc"),
        ({"subnetwork": "train-sub"}, "global/networks/default"),  # asked of subnetworks.get
        ({"subnetwork": f"projects/{GCP_PROJECT}/regions/us-central1/subnetworks/s"}, "networks/default"),
    ],
    ids=["default", "network", "both", "subnetwork-name", "subnetwork-path"],
)
def test_the_rule_is_on_the_vm_s_network(emu, kw: dict[str, Any], network: str) -> None:
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.lifecycle.prepare import LaunchOptions

    digest = uuid.uuid4().hex[:20]
    backend = GcpRunBackend("google_cloud_default", None, "us-central1")
    ledger = ResourceLedger(digest)
    backend.protect_network(ledger, digest, LaunchOptions(**kw), lambda: None, None)
    try:
        (rule,) = rules_of(emu, digest).values()
        assert rule.network.endswith(network)
    finally:
        ledger.release(backend)
    assert rules_of(emu, digest) == {}


def test_an_unknown_subnetwork_fails_before_anything_is_made(emu) -> None:
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend
    from airflow_cloudtrain.contract.errors import InvalidRequest
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.lifecycle.prepare import LaunchOptions

    digest = uuid.uuid4().hex[:20]
    backend = GcpRunBackend("google_cloud_default", None, "us-central1")
    options = LaunchOptions(subnetwork=f"projects/{GCP_PROJECT}/regions/mars-north1/subnetworks/s")
    with pytest.raises(InvalidRequest, match="subnetwork=.*mars-north1"):
        backend.protect_network(ResourceLedger(digest), digest, options, lambda: None, None)
    assert rules_of(emu, digest) == {}


def test_a_deferred_run_killed_in_the_triggerer_releases_the_rule_after_its_vm(emu) -> None:
    """``RunTrigger.on_kill`` knows only the launch record (no store): the VM first, then the rule,
    found by name from the run key."""
    import asyncio

    from airflow_cloudtrain.catalog import choose_offer
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend
    from airflow_cloudtrain.core.cloud import LaunchRequest
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.core.records import LaunchRecord
    from airflow_cloudtrain.lifecycle.prepare import LaunchOptions
    from airflow_cloudtrain.spec import Hardware
    from airflow_cloudtrain.triggers.run import RunTrigger

    key = RunKey("firewall_trigger", "train", f"manual__{uuid.uuid4().hex}", -1, BUCKET)
    backend = GcpRunBackend("google_cloud_default", None, "us-central1")
    backend.protect_network(ResourceLedger(key.digest), key.digest, LaunchOptions(), lambda: None, None)
    request = LaunchRequest(
        offer=choose_offer("gcspot", Hardware(cpus=2), zone="us-central1-b"),
        zone="us-central1-b",
        user_data="#!/bin/bash\ntrue\n",
        tags=key.tags(),
        client_token=f"{key.digest}-1-0",
        disk_gib=20,
        provisioning="spot",
    )
    vm = backend.cloud.launch(request)
    assert vm_tags(emu, "us-central1-b", vm.id) == [f"ct-{key.digest}"]
    launch = LaunchRecord(
        run_id=key.short_id,
        run_uri=f"{BUCKET}/{key.path()}",
        cloud="gcspot",
        region="us-central1",
        instance_id=vm.id,
        zone="us-central1-b",
        run_key=key.digest,
        location="us-central1-b",
    )
    asyncio.run(RunTrigger(launch=launch.to_dict(), conn_id="google_cloud_default").on_kill())
    assert rules_of(emu, key.digest) == {}
    assert [i for i in emu.gce.alive() if i["labels"].get("cloudtrain-run-key") == key.digest] == []
