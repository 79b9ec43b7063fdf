"""The gang's contract (``contract.gang``): the environment every node's job gets, and the barrier keys."""

from __future__ import annotations

import pytest

from airflow_cloudtrain.contract import gang, runs


def test_node_env_gives_ours_and_torchruns_names() -> None:
    ips = ["10.0.0.5", "10.0.0.7", "10.0.0.6"]
    assert gang.node_env(1, ips, 8, 29501) == {
        "CLOUDTRAIN_NODE_RANK": "1",
        "CLOUDTRAIN_NUM_NODES": "3",
        "CLOUDTRAIN_NODE_IPS": "10.0.0.5\n10.0.0.7\n10.0.0.6",
        "CLOUDTRAIN_HEAD_IP": "10.0.0.5",
        "CLOUDTRAIN_GPUS_PER_NODE": "8",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29501",
        "NODE_RANK": "1",
        "NNODES": "3",
    }
    assert gang.node_env(0, ["10.0.0.5"], 0)["MASTER_PORT"] == "29500"


@pytest.mark.parametrize(
    ("rank", "ips", "port", "match"),
    [
        (3, ["a", "b", "c"], 29500, "rank 3 is not in 0..2"),
        (0, [], 29500, "at least one node"),
        (0, ["a"], 0, "port 0"),
    ],
)
def test_node_env_refuses_what_cannot_be_a_gang(rank: int, ips: list[str], port: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gang.node_env(rank, ips, 1, port)


def test_barrier_keys_and_records_round_trip() -> None:
    assert gang.node_key(2) == "nodes/2.json" and gang.RANKS_KEY == "nodes/ranks.json"
    record = gang.NodeRecord(2, "i-abc", "10.0.0.9", 1.5)
    assert gang.NodeRecord.from_json(record.to_json()) == record
    assert gang.parse_ranks(gang.ranks_json(["i-a", "i-b"])) == ["i-a", "i-b"]
    with pytest.raises(ValueError, match="must differ"):
        gang.ranks_json(["i-a", "i-a"])
    with pytest.raises(ValueError, match="no list of instance ids"):
        gang.parse_ranks('{"nodes": "i-a"}')


def test_a_spec_without_gang_fields_is_a_single_node() -> None:
    old = runs.RunSpec(run_id="r", run_uri="s3://b/r", cloud="ec2", command="true").to_json()
    spec = runs.RunSpec.from_json(old.replace('"num_nodes": 1,', ""))
    assert (spec.num_nodes, spec.node_rank) == (1, None)
