"""``cloudtrain gc`` against the emulated clouds: every kind of resource a run can leave, planted with the
product's own create calls for runs whose run folder says finished, lapsed or orphaned (and one with no
run folder at all), beside a LIVE run (fresh lease). ``--dry-run`` lists exactly the planted ones (the
live run's as keep) and calls nothing that changes a thing; without it, the planted ones go through the
ledger's deleters and the live run's resources are still there."""

from __future__ import annotations

import contextlib
import io
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from test_running_index import plant_running
from waiting import wait_for

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.cli import main
from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned
from airflow_cloudtrain.contract.runs import (
    SPEC_KEY,
    TAG_PRICE,
    TAG_RUN_URI,
    RunKey,
    RunSpec,
    RunStatus,
    join,
    status_key,
)
from airflow_cloudtrain.core.cloud import LaunchRequest
from airflow_cloudtrain.core.ledger import ResourceLedger
from airflow_cloudtrain.lifecycle.cost_index import STARTUP_GRACE_S
from airflow_cloudtrain.lifecycle.running_entry import SILENT_AFTER_S
from airflow_cloudtrain.spec import Hardware
from airflow_cloudtrain.storage import open_run_folder

AWS_REGION, GCP_REGION, ZONE = "us-east-1", "us-central1", "us-central1-a"
# the kinds whose delete calls change something; a dry run makes none of them
WRITE_WORDS = (
    "create", "delete", "terminate", "put", "update", "run", "set", "cancel", "authorize",
    "insert", "patch", "resize", "upload", "publish", "acknowledge", "modify", "purge",
)  # fmt: skip


def key(bucket: str, name: str) -> RunKey:
    return RunKey("gc_dag", name, f"manual__{uuid.uuid4().hex[:8]}", -1, scope=bucket)


def write_run(bucket: str, k: RunKey, state: str, cloud: str) -> str:
    """The run folder of ``k`` saying ``state``: finished (a final status), lapsed (a lease not
    renewed for 2 h), orphaned (``orphaned.json``), live (a lease renewed now), none (no folder)."""
    uri = join(bucket, k.path())
    if state in ("none", "empty"):
        return uri
    folder = open_run_folder(uri)
    folder.put_text(SPEC_KEY, RunSpec(k.short_id, uri, cloud, "true").to_json())
    now = time.time()
    if state == "finished":
        folder.put_text(status_key("i-0"), RunStatus("succeeded", "i-0", 0, ended_at=now).to_json())
    elif state == "lapsed":
        folder.put_text(LEASE_KEY, Lease(now - 7200, 1800.0, "triggerer").to_json())
    elif state == "orphaned":
        folder.put_text(LEASE_KEY, Lease(now - 7200, 1800.0, "worker").to_json())
        folder.put_text(ORPHANED_KEY, Orphaned(now - 5400, "agent", now - 5300).to_json())
    elif state == "live":
        folder.put_text(LEASE_KEY, Lease(now, 1800.0, "triggerer").to_json())
    return uri


def request(cloud: str, k: RunKey, uri: str, zone: str | None, **where: Any) -> LaunchRequest:
    offer = choose_offer(cloud, Hardware(2, 0, "4g"), zone=zone, **where)
    return LaunchRequest(
        offer=offer,
        zone=zone,
        user_data="#!/bin/bash\ntrue\n",  # no CT_RUN_URI: the emulator starts no agent
        tags={**k.tags(), TAG_RUN_URI: uri, TAG_PRICE: "96000"},
        client_token=f"{k.digest}-1-0",
        disk_gib=20,
    )


def gc_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["gc", *args])
    return code, out.getvalue()


def listing(*args: str) -> list[dict[str, Any]]:
    code, text = gc_cli(*args, "--json")
    assert code == 0, text
    return list(json.loads(text)["resources"])


def writes(counts: dict[str, int]) -> dict[str, int]:
    def is_write(op: str) -> bool:
        name = op.rsplit(".", 1)[-1].lower() if "." in op else op.lower()
        return any(name.startswith(w) for w in WRITE_WORDS)

    return {op: n for op, n in counts.items() if is_write(op) and not op.startswith("throttled:")}


def mine(rows: list[dict[str, Any]], digests: set[str]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["kind"], r["id"]): r for r in rows if r["digest"] in digests}


def check_gc(
    emu: Any,
    args: list[str],
    planted: dict[str, set[tuple[str, str]]],
    kept: set[tuple[str, str]],
    describe: Callable[[], set[tuple[str, str]]],
    leases: dict[str, str],
) -> None:
    """The dry run lists exactly ``planted`` (digest -> (kind, id)), each with its run's lease state
    (``leases``: digest -> live/lapsed/finished/unknown), ``kept`` (the live run's) as keep, and changes
    nothing; the real run deletes the others and leaves ``kept``."""
    digests = set(planted)
    doomed = {r for rs in planted.values() for r in rs} - kept
    before = describe()
    assert doomed | kept <= before

    emu.reset_counts()
    rows = mine(listing(*args, "--dry-run"), digests)
    assert set(rows) == doomed | kept
    for kind_id, row in rows.items():
        assert row["lease"] == leases[row["digest"]], row
        if kind_id in kept:
            assert row["action"] == "keep", row
        else:
            assert row["action"] == "delete" and row["lease"] != "live", row
    assert writes(emu.request_counts()) == {}
    assert describe() == before
    code, text = gc_cli(*args, "--dry-run")  # the table a person reads
    assert code == 0 and "would be deleted; nothing was changed" in text and "lease fresh" in text

    code, text = gc_cli(*args)
    assert code == 0, text
    for kind, rid in doomed:
        assert f"  {kind} {rid}" in text
    wait_for(lambda: not (describe() & doomed), timeout=120, message="planted leftovers deleted")
    assert kept <= describe()
    left = mine(listing(*args), digests)
    assert set(left) == kept


LEASES = {
    "finished": "finished",
    "lapsed": "lapsed",
    "orphaned": "lapsed",
    "none": "unknown",  # no run folder known (the resource carries only its run key)
    "empty": "finished",  # a run folder named but empty
    "live": "live",
}


def assert_gc_recorded_the_orphan(bucket_uri: str, task: str) -> None:
    """``orphaned.json`` (ended by gc) in the run folder of the run whose lease lapsed."""
    keys = [
        k
        for k in open_run_folder(join(bucket_uri, f"runs/gc_dag/{task}")).list("")
        if k.endswith(ORPHANED_KEY)
    ]
    assert len(keys) == 1, keys
    text = open_run_folder(join(bucket_uri, f"runs/gc_dag/{task}")).get_text(keys[0]) or ""
    record = Orphaned.from_json(text)
    assert record.ended_by == "gc" and record.lapsed_at < record.noticed_at


# --- AWS ---------------------------------------------------------------------------------------------


def plant_aws(backend: Any, k: RunKey, uri: str, kinds: set[str]) -> set[tuple[str, str]]:
    from airflow_cloudtrain.clouds.aws import secrets
    from airflow_cloudtrain.clouds.aws.fleet import fleet_of, group_name, queue_name
    from airflow_cloudtrain.clouds.aws.gang_net import ensure_gang_network

    d, out = k.digest, set()
    if "instance" in kinds:
        inst = backend.cloud.launch(request("ec2", k, uri, None, region=AWS_REGION))
        out.add(("instance", inst.id))
    if "ssm_parameter" in kinds:
        out.add(("ssm_parameter", secrets.put_secret(backend, d, "TOKEN", "s3cr3t")[0]))
    fleet = fleet_of(backend)
    if "sqs_queue" in kinds:
        for dead in (True, False):
            out.add(("sqs_queue", fleet.create_queue(queue_name(d, dead), k.tags(), 60, None, 3)))
    if "asg" in kinds:
        name = group_name(d)
        req = request("ec2", k, uri, None, region=AWS_REGION)
        template = fleet.create_template(name, req, "ami-12c6146b", "/dev/xvda")
        fleet.create_group(name, template, ["t3.micro"], False, None, 0, 2, [f"{AWS_REGION}a"], [], k.tags())
        out |= {("launch_template", name), ("asg", name)}
    if "security_group" in kinds:
        net = ensure_gang_network(backend, ResourceLedger(d), d, placement="cluster")
        out |= {("security_group", net.security_group_id), ("placement_group", net.placement_group or "")}
    return out


def aws_describe(backend: Any, digests: set[str]) -> Callable[[], set[tuple[str, str]]]:
    """What EC2, Auto Scaling, SQS and SSM hold of these runs, read with plain boto3 calls."""
    import boto3

    def describe() -> set[tuple[str, str]]:
        ec2, out = boto3.client("ec2", region_name=AWS_REGION), set()
        for r in ec2.describe_instances()["Reservations"]:
            for i in r["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                if tags.get("cloudtrain-run-key") in digests and i["State"]["Name"] != "terminated":
                    out.add(("instance", i["InstanceId"]))
        for g in ec2.describe_security_groups()["SecurityGroups"]:
            if any(t["Value"] in digests for t in g.get("Tags", []) if t["Key"] == "cloudtrain-run-key"):
                out.add(("security_group", g["GroupId"]))
        for d in digests:
            name = f"ct-{d}"
            out |= {("placement_group", p["GroupName"]) for p in ec2.describe_placement_groups()[
                "PlacementGroups"] if p["GroupName"] == f"{name}-gang"}  # fmt: skip
            lts = ec2.describe_launch_templates()["LaunchTemplates"]
            out |= {
                ("launch_template", t["LaunchTemplateName"]) for t in lts if t["LaunchTemplateName"] == name
            }
            groups = boto3.client("autoscaling", region_name=AWS_REGION).describe_auto_scaling_groups()
            out |= {("asg", name) for g in groups["AutoScalingGroups"] if g["AutoScalingGroupName"] == name}
            urls = boto3.client("sqs", region_name=AWS_REGION).list_queues(QueueNamePrefix=name)
            out |= {("sqs_queue", u) for u in urls.get("QueueUrls", [])}
            params = boto3.client("ssm", region_name=AWS_REGION).describe_parameters(
                ParameterFilters=[{"Key": "Name", "Option": "BeginsWith", "Values": [f"/cloudtrain/{d}/"]}]
            )
            out |= {("ssm_parameter", p["Name"]) for p in params["Parameters"]}
        return out

    return describe


def test_gc_on_aws_lists_the_planted_leftovers_and_deletes_them_but_not_the_live_run(emu: Any) -> None:
    import boto3

    from airflow_cloudtrain.clouds.registry import backend_for
    from airflow_cloudtrain.lifecycle.gc import sources

    bucket = f"gc-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", region_name=AWS_REGION).create_bucket(Bucket=bucket)
    bucket_uri = f"s3://{bucket}"
    backend = backend_for("ec2", region=AWS_REGION)
    sources("aws", AWS_REGION)  # registers the fleet's kinds
    every = {"instance", "ssm_parameter", "sqs_queue", "asg", "security_group"}
    runs = {  # name -> (run folder state, kinds planted)
        "finished": ("finished", every),
        "lapsed": ("lapsed", {"instance", "ssm_parameter", "sqs_queue"}),
        "orphaned": ("orphaned", {"security_group", "ssm_parameter"}),
        "nofolder": ("none", {"ssm_parameter"}),  # the run key alone: decided by age
        "live": ("live", {"instance", "ssm_parameter", "sqs_queue", "security_group"}),
    }
    planted: dict[str, set[tuple[str, str]]] = {}
    leases: dict[str, str] = {}
    live = ""
    try:
        for name, (state, kinds) in runs.items():
            k = key(bucket_uri, name)
            uri = write_run(bucket_uri, k, state, "ec2")
            planted[k.digest] = plant_aws(backend, k, uri, kinds)
            live = k.digest if name == "live" else live
            leases[k.digest] = LEASES[state]
        args = ["--cloud", "aws", "--region", AWS_REGION, "--bucket", bucket_uri, "--older-than", "0"]
        # the orphaned run's security group and parameter carry only its run key: its run folder is
        # found under --bucket (its spec.json), so they are "lapsed", not "unknown"
        check_gc(emu, args, planted, planted[live], aws_describe(backend, set(planted)), leases)
        assert_gc_recorded_the_orphan(bucket_uri, "lapsed")
    finally:
        for digest in planted:  # the live run's (and anything a failed assertion left)
            ledger = ResourceLedger(digest)
            ledger.sweep(backend, ["instance", "ssm_parameter", "sqs_queue", "launch_template", "asg",
                                   "security_group", "placement_group"])  # fmt: skip
            ledger.release(backend, sweep=False)


# --- GCP ---------------------------------------------------------------------------------------------


def plant_gcp(backend: Any, vertex: Any, k: RunKey, uri: str, kinds: set[str]) -> set[tuple[str, str]]:
    from types import SimpleNamespace

    from airflow_cloudtrain.clouds.gcp import firewall, secrets
    from airflow_cloudtrain.clouds.gcp.fleet import fleet_of, group_name, queue_name
    from airflow_cloudtrain.clouds.gcp.gang_net import ensure_gang_network
    from airflow_cloudtrain.clouds.gcp.gce import gcp_cloud

    d, out = k.digest, set()
    project = backend.hook.project
    if "instance" in kinds:
        inst = gcp_cloud(backend.hook, GCP_REGION, ZONE).launch(request("gcloud", k, uri, ZONE))
        out.add(("instance", inst.id))
    if "firewall" in kinds:
        options = SimpleNamespace(network=None, subnetwork=None, ssh_source_ranges=None)
        ledger = ResourceLedger(d)
        firewall.protect_run(backend, ledger, d, options, GCP_REGION, lambda: None)
        out |= {("firewall", e.id) for e in ledger.entries}
    if "gcp_secret" in kinds:
        out.add(("gcp_secret", secrets.put_secret(backend, d, "TOKEN", "s3cr3t")[0]))
    fleet = fleet_of(backend, ZONE)
    if "pubsub_topic" in kinds:
        topic = fleet.create_topic(queue_name(d), k.tags())
        sub = fleet.create_subscription(queue_name(d), topic, k.tags(), 60, None, 5)
        out |= {("pubsub_topic", topic), ("pubsub_subscription", sub)}
    if "mig" in kinds:
        name = group_name(d)
        template = fleet.create_template(name, request("gcloud", k, uri, ZONE))
        fleet.create_group(name, template, 0)
        out |= {("instance_template", name), ("mig", name)}
    if "gang_firewall" in kinds:
        ensure_gang_network(backend, ResourceLedger(d), d, GCP_REGION, placement="cluster")
        out |= {("gang_firewall", f"ct-{d}-gang"), ("placement_policy", f"ct-{d}-gang")}
    if "vertex_job" in kinds:
        job = vertex.create(vertex_job(k, uri))
        out.add(("vertex_job", job.name))
        assert project
    return out


def vertex_job(k: RunKey, uri: str) -> dict[str, Any]:
    forever = "import time\nwhile True: time.sleep(0.2)"
    pool = {
        "replica_count": 1,
        "machine_spec": {"machine_type": "n1-standard-4"},
        "container_spec": {"image_uri": "us-docker.pkg.dev/x/y:1", "command": ["python", "-c", forever]},
    }
    labels = {kk: v.lower()[:63] for kk, v in k.tags().items()}
    labels["cloudtrain-run-id"] = "gc"
    spec = {"worker_pool_specs": [pool], "base_output_directory": {"output_uri_prefix": uri}}
    return {"display_name": f"gc-{k.digest[:8]}", "job_spec": spec, "labels": labels}


def gcp_describe(backend: Any, vertex: Any, digests: set[str]) -> Callable[[], set[tuple[str, str]]]:
    """What Compute Engine, Pub/Sub, Secret Manager and Vertex AI hold of these runs (client calls)."""
    from google.cloud import compute_v1

    from airflow_cloudtrain.clouds.gcp.fleet import fleet_of
    from airflow_cloudtrain.clouds.gcp.gce import zones_of

    hook, project = backend.hook, backend.hook.project
    kwargs = hook._client_kwargs("compute_endpoint")

    def ours(name: str) -> bool:
        return any(f"ct-{d}" in name or f"cloudtrain-{d}-" in name for d in digests)

    def describe() -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for zone in zones_of(GCP_REGION):
            for vm in hook.instances_client().list(project=project, zone=zone):
                if dict(vm.labels).get("cloudtrain-run-key") in digests:
                    out.add(("instance", vm.name))
            out |= {
                ("mig", g.name) for g in hook.groups_client().list(project=project, zone=zone) if ours(g.name)
            }
        out |= {
            ("instance_template", t.name)
            for t in hook.templates_client().list(project=project)
            if ours(t.name)
        }
        for rule in compute_v1.FirewallsClient(**kwargs).list(project=project):
            if ours(rule.name):
                out.add(("gang_firewall" if rule.name.endswith("-gang") else "firewall", rule.name))
        policies = compute_v1.ResourcePoliciesClient(**kwargs).list(project=project, region=GCP_REGION)
        out |= {("placement_policy", p.name) for p in policies if ours(p.name)}
        fleet = fleet_of(backend)
        out |= {("pubsub_topic", t.name) for t in fleet.publisher.list_topics(
            request={"project": f"projects/{project}"}) if ours(t.name)}  # fmt: skip
        out |= {("pubsub_subscription", s.name) for s in fleet.subscriber.list_subscriptions(
            request={"project": f"projects/{project}"}) if ours(s.name)}  # fmt: skip
        from airflow_cloudtrain.clouds.gcp.secrets import _client

        out |= {("gcp_secret", s.name) for s in _client(backend).list_secrets(
            request={"parent": f"projects/{project}"}) if ours(s.name)}  # fmt: skip
        out |= {
            ("vertex_job", j.name)
            for j in vertex.active_managed()
            if j.labels.get("cloudtrain-run-key") in digests
        }
        return out

    return describe


def test_gc_on_gcp_lists_the_planted_leftovers_and_deletes_them_but_not_the_live_run(emu: Any) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from airflow_cloudtrain.emulator import GCP_PROJECT
    from airflow_cloudtrain.lifecycle.gc import sources

    bucket = f"gc-{uuid.uuid4().hex[:10]}"
    storage.Client(project=GCP_PROJECT, credentials=AnonymousCredentials()).create_bucket(bucket)
    bucket_uri = f"gs://{bucket}"
    gcp, vertex_source = sources("gcp", GCP_REGION)
    backend, vertex = gcp.backend, vertex_source.backend
    every = {"instance", "firewall", "gcp_secret", "pubsub_topic", "mig", "gang_firewall", "vertex_job"}
    runs = {
        "finished": ("finished", every - {"vertex_job"}),
        "lapsed": ("lapsed", {"instance", "gcp_secret", "pubsub_topic", "vertex_job"}),
        "orphaned": ("orphaned", {"gang_firewall", "firewall"}),
        "nofolder": ("none", {"gcp_secret"}),
        # a job whose folder is still empty and that has no lease: kept (only a lapsed lease cancels)
        "quiet": ("empty", {"vertex_job"}),
        "live": ("live", {"instance", "firewall", "gcp_secret", "pubsub_topic", "vertex_job"}),
    }
    planted: dict[str, set[tuple[str, str]]] = {}
    leases: dict[str, str] = {}
    live = quiet = ""
    try:
        for name, (state, kinds) in runs.items():
            k = key(bucket_uri, name)
            uri = write_run(bucket_uri, k, state, "gcloud")
            planted[k.digest] = plant_gcp(backend, vertex, k, uri, kinds)
            live = k.digest if name == "live" else live
            quiet = k.digest if name == "quiet" else quiet
            leases[k.digest] = LEASES[state]
        args = ["--cloud", "gcp", "--region", GCP_REGION, "--bucket", bucket_uri, "--older-than", "0"]
        kept = planted[live] | planted[quiet]
        check_gc(emu, args, planted, kept, gcp_describe(backend, vertex, set(planted)), leases)
        assert_gc_recorded_the_orphan(bucket_uri, "lapsed")  # its Vertex job was cancelled by gc
    finally:
        kinds = ["mig", "instance_template", "pubsub_subscription", "pubsub_topic", "gcp_secret", "instance",
                 "gang_firewall", "placement_policy", "firewall"]  # fmt: skip
        for digest in planted:
            ledger = ResourceLedger(digest)
            ledger.sweep(backend, kinds)
            ledger.release(backend, sweep=False)
            ResourceLedger(digest).release(vertex)


def test_nothing_younger_than_older_than_is_touched(emu: Any) -> None:
    """The default ``--older-than`` (1 h) keeps a run's resources made a moment ago, whatever its
    run folder says: a run being launched now has no lease yet."""
    import boto3

    from airflow_cloudtrain.clouds.aws import secrets
    from airflow_cloudtrain.clouds.registry import backend_for

    bucket = f"gc-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", region_name=AWS_REGION).create_bucket(Bucket=bucket)
    k = key(f"s3://{bucket}", "young")
    write_run(f"s3://{bucket}", k, "finished", "ec2")
    backend = backend_for("ec2", region=AWS_REGION)
    name = secrets.put_secret(backend, k.digest, "TOKEN", "v")[0]
    try:
        code, text = gc_cli("--cloud", "ec2", "--region", AWS_REGION, "--bucket", f"s3://{bucket}")
        assert code == 0
        (row,) = [line for line in text.splitlines() if name in line]
        assert "keep: younger than 1h" in row and "finished" in row
        params = boto3.client("ssm", region_name=AWS_REGION).describe_parameters(
            ParameterFilters=[{"Key": "Name", "Option": "Equals", "Values": [name]}]
        )["Parameters"]
        assert [p["Name"] for p in params] == [name]
    finally:
        boto3.client("ssm", region_name=AWS_REGION).delete_parameter(Name=name)


def test_a_throttled_listing_is_waited_out(emu: Any) -> None:
    """Half of the Pub/Sub calls refused as throttled (429, as a project's quota answers): gc's
    listings are asked again, as every other call of ours is, and the sweep lists; it failed at once
    (the fault campaign's checker met it in scenario s009)."""
    emu.throttle(0.5, api="pubsub", seed=1)
    try:
        code, text = gc_cli("--cloud", "gcloud", "--region", "us-central1", "--dry-run")
    finally:
        emu.throttle(0.0, api="pubsub")
    assert code == 0, text
    assert (
        emu.request_counts().get("throttled:topics.list", 0)
        + emu.request_counts().get("throttled:subscriptions.list", 0)
        > 0
    ), emu.request_counts()  # the fault did land


@pytest.mark.parametrize("bad", ["soon", "-1h", "1x"])
def test_a_bad_older_than_is_refused_naming_the_option(bad: str, capsys: Any) -> None:
    with pytest.raises(SystemExit):
        main(["gc", "--cloud", "aws", "--older-than", bad])
    assert "--older-than" in capsys.readouterr().err


def test_the_operator_sweeps_in_a_dag_and_returns_the_listing(emu: Any, airflow_db: None) -> None:
    """A daily DAG's ``CloudTrainGcOperator``: a finished run's secret goes, a live run's stays, and the
    listing is the task's XCom."""
    import boto3
    from dag_helpers import task_states, write_dag, xcom

    from airflow_cloudtrain.clouds.aws import secrets
    from airflow_cloudtrain.clouds.registry import backend_for

    bucket = f"gc-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", region_name=AWS_REGION).create_bucket(Bucket=bucket)
    backend = backend_for("ec2", region=AWS_REGION)
    names = {}
    for state in ("finished", "live"):
        k = key(f"s3://{bucket}", state)
        write_run(f"s3://{bucket}", k, state, "ec2")
        names[state] = secrets.put_secret(backend, k.digest, "TOKEN", "v")[0]
    # an attempt's entry in the running index whose release was cut short (its agent ended): gc's
    folder = open_run_folder(f"s3://{bucket}")
    stale = plant_running(folder, "i-left", time.time() - 7200, ended=True)
    dag_id = f"gc_daily_{uuid.uuid4().hex[:6]}"
    dag = write_dag(
        f"""
from datetime import datetime
from airflow.sdk import DAG
from airflow_cloudtrain.operators import CloudTrainGcOperator

with DAG({dag_id!r}, schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as dag:
    CloudTrainGcOperator(task_id="gc", cloud="aws", region={AWS_REGION!r}, bucket="s3://{bucket}",
                         older_than=0)
""",
        dag_id,
    )
    ssm = boto3.client("ssm", region_name=AWS_REGION)
    try:
        run = dag.test()
        assert task_states(run) == {"gc": "success"}
        rows = {r["id"]: r for r in xcom(run, "gc")}
        assert (
            rows[names["finished"]]["action"] == "delete" and rows[names["finished"]]["result"] == "deleted"
        )
        assert rows[names["live"]]["action"] == "keep" and rows[names["live"]]["lease"] == "live"
        assert rows["ct-left-i-left-i-left.json"]["kind"] == "running_index"
        assert rows["ct-left-i-left-i-left.json"]["result"] == "deleted"
        assert folder.get_text(stale) is None
        ours = [{"Key": "Name", "Option": "BeginsWith", "Values": ["/cloudtrain/"]}]
        pages = ssm.get_paginator("describe_parameters").paginate(ParameterFilters=ours)
        left = {p["Name"] for page in pages for p in page["Parameters"]}
        assert names["live"] in left and names["finished"] not in left
    finally:
        ssm.delete_parameters(Names=list(names.values()))


def test_gc_deletes_the_running_index_entries_no_attempt_stands_behind(emu: Any) -> None:
    """``--bucket``: the in-flight records a killed task or a cut-short release left in the bucket's
    running index are listed (kind ``running_index``) and deleted when older than ``--older-than``;
    one whose instance may still be booting is not listed, and ``--dry-run`` deletes nothing."""
    import boto3

    bucket = f"gc-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", region_name=AWS_REGION).create_bucket(Bucket=bucket)
    bucket_uri = f"s3://{bucket}"
    folder, now = open_run_folder(bucket_uri), time.time()
    keys = {
        "i-booting": plant_running(folder, "i-booting", now - 60),  # no agent yet, it may still come
        "i-never": plant_running(folder, "i-never", now - STARTUP_GRACE_S - 60),  # its task was killed
        "i-ended": plant_running(folder, "i-ended", now - 3600, ended=True),  # the release cut short
        "i-young": plant_running(folder, "i-young", now - 120, ended=True),  # younger than --older-than
        # a fleet's record (no agent of its own): its watch stopped rewriting it, or still does
        "g-silent": plant_running(folder, "g-silent", now - 7200, updated_at=now - SILENT_AFTER_S - 60),
        "g-watched": plant_running(folder, "g-watched", now - 7200, updated_at=now - 60),
    }
    args = ["--cloud", "aws", "--region", AWS_REGION, "--bucket", bucket_uri, "--older-than", "10m"]
    rows = {r["id"]: r for r in listing(*args, "--dry-run") if r["kind"] == "running_index"}
    assert set(rows) == {keys[i].rsplit("/", 1)[1] for i in ("i-never", "i-ended", "i-young", "g-silent")}
    action = {r["id"].split("-")[-1].removesuffix(".json"): (r["action"], r["lease"]) for r in rows.values()}
    assert action == {
        "never": ("delete", "unknown"),
        "ended": ("delete", "finished"),
        "young": ("keep", "finished"),
        "silent": ("delete", "unknown"),
    }
    assert rows[keys["g-silent"].rsplit("/", 1)[1]]["age_s"] == pytest.approx(SILENT_AFTER_S + 60, abs=30)
    assert all(folder.get_text(k) is not None for k in keys.values())  # the dry run deleted nothing
    code, text = gc_cli(*args)
    assert code == 0, text
    left = {i for i, k in keys.items() if folder.get_text(k) is not None}
    assert left == {"i-booting", "i-young", "g-watched"}
