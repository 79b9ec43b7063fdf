"""A gang's network on GCE (``clouds.gcp.gang_net``) against the emulated Compute Engine: the rule that
lets the run's VMs reach each other (from the run's tag to the run's tag, above the run's deny rule)
and the compact placement policy, re-attached by a retry, deleted at teardown after the run's VMs,
and found by name from the run key when the ledger lost them (a task killed halfway, a create whose
answer was lost). Read back with the real ``compute_v1`` clients. The emulator's resource policies
are checked first: what the real API accepts and refuses."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from airflow_cloudtrain.emulator import GCP_PROJECT
from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs

REGION, ZONE = "us-central1", "us-central1-a"


def client(emu: Any, name: str) -> Any:
    return getattr(compute_v1, name)(**compute_client_kwargs(emu.gce_endpoint))


def policies(emu: Any) -> Any:
    return client(emu, "ResourcePoliciesClient")


def backend() -> Any:
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend

    return GcpRunBackend("google_cloud_default", None, REGION)


def rules_of(emu: Any, digest: str) -> dict[str, Any]:
    return {
        r.name: r
        for r in client(emu, "FirewallsClient").list(project=GCP_PROJECT)
        if r.name.startswith(f"ct-{digest}-")
    }


def policies_of(emu: Any, digest: str) -> list[str]:
    return [
        p.name
        for p in policies(emu).list(project=GCP_PROJECT, region=REGION)
        if p.name.startswith(f"ct-{digest}-")
    ]


def policy(name: str, **group: Any) -> compute_v1.ResourcePolicy:
    return compute_v1.ResourcePolicy(name=name, group_placement_policy={"collocation": "COLLOCATED", **group})


def vm(name: str, tag: str, policy_path: str | None = None) -> compute_v1.Instance:
    body: dict[str, Any] = {
        "name": name,
        "machine_type": f"zones/{ZONE}/machineTypes/n1-standard-4",
        "tags": {"items": [tag]},
        "disks": [
            {
                "boot": True,
                "auto_delete": True,
                "initialize_params": {"source_image": "projects/debian-cloud/global/images/family/debian-12"},
            }
        ],
        "labels": {"cloudtrain-run-key": tag[3:], "cloudtrain-managed": "true"},
    }
    if policy_path:
        body["resource_policies"] = [policy_path]
    return compute_v1.Instance(body)


# --- the emulator's resource policies ----------------------------------------------------------------


def test_a_placement_policy_is_created_read_listed_and_deleted(emu: Any) -> None:
    api, name = policies(emu), f"pp-{uuid.uuid4().hex[:8]}"
    api.insert(project=GCP_PROJECT, region=REGION, resource_policy_resource=policy(name)).result(timeout=120)
    got = api.get(project=GCP_PROJECT, region=REGION, resource_policy=name)
    assert got.group_placement_policy.collocation == "COLLOCATED" and got.region.endswith(f"regions/{REGION}")
    request = compute_v1.ListResourcePoliciesRequest(
        project=GCP_PROJECT, region=REGION, filter=f'name eq "{name}"'
    )
    assert [p.name for p in api.list(request=request)] == [name]
    with pytest.raises(gexc.Conflict):
        api.insert(project=GCP_PROJECT, region=REGION, resource_policy_resource=policy(name))
    api.delete(project=GCP_PROJECT, region=REGION, resource_policy=name).result(timeout=120)
    with pytest.raises(gexc.NotFound):
        api.get(project=GCP_PROJECT, region=REGION, resource_policy=name)
    with pytest.raises(gexc.NotFound):
        api.delete(project=GCP_PROJECT, region=REGION, resource_policy=name)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"name": "1-bad", "group_placement_policy": {"collocation": "COLLOCATED"}}, "resource.name"),
        ({"name": "p", "group_placement_policy": {"collocation": "NEARBY"}}, "collocation"),
        (
            {
                "name": "p",
                "group_placement_policy": {"collocation": "COLLOCATED", "availability_domain_count": 2},
            },
            "availabilityDomainCount",
        ),
        ({"name": "p"}, "Exactly one policy type"),
    ],
)
def test_the_api_refuses_what_gce_refuses(emu: Any, body: dict[str, Any], words: str) -> None:
    with pytest.raises(gexc.BadRequest, match=words):
        policies(emu).insert(
            project=GCP_PROJECT, region=REGION, resource_policy_resource=compute_v1.ResourcePolicy(body)
        )


def test_a_policy_a_vm_names_cannot_be_deleted_until_the_vm_is_gone(emu: Any) -> None:
    api, name = policies(emu), f"pp-{uuid.uuid4().hex[:8]}"
    api.insert(project=GCP_PROJECT, region=REGION, resource_policy_resource=policy(name)).result(timeout=120)
    vms, vm_name = client(emu, "InstancesClient"), f"vm-{uuid.uuid4().hex[:8]}"
    path = f"projects/{GCP_PROJECT}/regions/{REGION}/resourcePolicies/{name}"
    vms.insert(project=GCP_PROJECT, zone=ZONE, instance_resource=vm(vm_name, "ct-x", path)).result(
        timeout=120
    )
    assert list(vms.get(project=GCP_PROJECT, zone=ZONE, instance=vm_name).resource_policies)[0].endswith(path)
    with pytest.raises(gexc.BadRequest, match="already being used"):
        api.delete(project=GCP_PROJECT, region=REGION, resource_policy=name)
    vms.delete(project=GCP_PROJECT, zone=ZONE, instance=vm_name).result(timeout=120)
    api.delete(project=GCP_PROJECT, region=REGION, resource_policy=name).result(timeout=60)


# --- the run's gang network --------------------------------------------------------------------------


def test_the_gang_rule_and_policy_are_made_once_and_go_after_the_vms(emu: Any) -> None:
    from airflow_cloudtrain.clouds.gcp.gang_net import FW_KIND, POLICY_KIND, ensure_gang_network
    from airflow_cloudtrain.core.ledger import ResourceLedger

    digest = uuid.uuid4().hex[:20]
    run = backend()
    emu.reset_counts()
    for _ in range(2):  # a retry re-attaches: nothing made twice
        ledger = ResourceLedger(digest)
        net = ensure_gang_network(run, ledger, digest, REGION, placement="cluster")
        assert [e.kind for e in ledger.entries] == [FW_KIND, POLICY_KIND]
    counts = emu.gce.counts()
    assert counts.get("firewalls.insert") == 1 and counts.get("resourcePolicies.insert") == 1, counts
    rule = rules_of(emu, digest)[f"ct-{digest}-gang"]
    tag = f"ct-{digest}"
    # every protocol, from the run's VMs to the run's VMs, above the run's deny rule; no address range
    assert list(rule.source_tags) == [tag] and list(rule.target_tags) == [tag]
    assert [a.I_p_protocol for a in rule.allowed] == ["all"] and rule.priority == 900 < 1000
    assert list(rule.source_ranges) == [] and rule.direction == "INGRESS"
    assert policies_of(emu, digest) == [f"ct-{digest}-gang"]
    assert (
        net.placement_policy == f"projects/{GCP_PROJECT}/regions/{REGION}/resourcePolicies/ct-{digest}-gang"
    )

    # a node of the gang naming the policy: the teardown deletes it first, then the rule and the policy
    vms, name = client(emu, "InstancesClient"), f"node-{uuid.uuid4().hex[:8]}"
    vms.insert(project=GCP_PROJECT, zone=ZONE, instance_resource=vm(name, tag, net.placement_policy)).result(
        timeout=120
    )
    ledger.release(run)
    assert rules_of(emu, digest) == {} and policies_of(emu, digest) == []
    with pytest.raises(gexc.NotFound):
        vms.get(project=GCP_PROJECT, zone=ZONE, instance=name)


def test_a_task_killed_between_the_two_creates_leaves_nothing_after_the_sweep(emu: Any) -> None:
    from airflow_cloudtrain.clouds.gcp.gang_net import FW_KIND, GANG_KINDS, ensure_gang_network
    from airflow_cloudtrain.core.ledger import ResourceLedger

    class Killed(Exception):
        pass

    digest = uuid.uuid4().hex[:20]
    run = backend()
    checks: list[int] = []

    def killed_before_the_second_create() -> None:
        checks.append(1)
        if len(checks) == 2:
            raise Killed

    with pytest.raises(Killed):
        ensure_gang_network(
            run,
            ResourceLedger(digest),
            digest,
            REGION,
            placement="cluster",
            check=killed_before_the_second_create,
        )
    assert list(rules_of(emu, digest)) == [f"ct-{digest}-gang"] and policies_of(emu, digest) == []
    assert [r.kind for r in ResourceLedger(digest).sweep(run, list(GANG_KINDS))] == [FW_KIND]
    run.sweep_kinds = (*run.sweep_kinds, *run.gang_kinds)  # what the abandon path does for a gang
    assert [r.kind for r in ResourceLedger(digest).release(run)] == [FW_KIND]
    assert rules_of(emu, digest) == {} and policies_of(emu, digest) == []


def test_a_create_whose_answer_was_lost_is_found_by_its_name(emu: Any) -> None:
    from airflow_cloudtrain.clouds.gcp.gang_net import FW_KIND, POLICY_KIND, resource_name, rule_body
    from airflow_cloudtrain.core.ledger import ResourceLedger

    digest = uuid.uuid4().hex[:20]
    run = backend()
    ledger = ResourceLedger(digest)
    ledger.intend(FW_KIND, GCP_PROJECT, token=resource_name(digest))
    ledger.intend(POLICY_KIND, REGION, token=resource_name(digest))
    body = compute_v1.Firewall(rule_body(digest, "global/networks/default"))
    client(emu, "FirewallsClient").insert(project=GCP_PROJECT, firewall_resource=body).result(timeout=120)
    policies(emu).insert(
        project=GCP_PROJECT, region=REGION, resource_policy_resource=policy(resource_name(digest))
    ).result(timeout=120)
    released = ledger.release(run)
    assert sorted(r.kind for r in released) == sorted([FW_KIND, POLICY_KIND])
    assert rules_of(emu, digest) == {} and policies_of(emu, digest) == []
