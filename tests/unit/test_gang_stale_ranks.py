"""A relaunched gang shares its run folder with the gang before it: an agent up before the operator
published the new gang's ranks reads the old ``nodes/ranks.json``, which does not name it. It waits for
its own gang's ranks (``agent.gang.join``), and only the gang's timeout ends that wait, naming the ranks
it saw. The in-memory bucket of ``test_gang_common_steps`` stands in for the run folder."""

from __future__ import annotations

import time
from dataclasses import replace

from test_gang_common_steps import Bucket, spec

from airflow_cloudtrain.agent.gang import join
from airflow_cloudtrain.contract import gang


class Relaunch(Bucket):
    """The earlier gang's ranks until the agent has read them ``reads_before`` times, then this gang's
    (as the operator publishes them right after the launch)."""

    def __init__(self, reads_before: int | None) -> None:
        super().__init__()
        self.reads_before, self.reads = reads_before, 0
        self.put_text(gang.RANKS_KEY, gang.ranks_json(["i-old0", "i-old1"]))
        self.put_text(gang.node_key(0), gang.NodeRecord(0, "i-old0", "10.0.0.1", time.time()).to_json())
        self.put_text(gang.node_key(1), gang.NodeRecord(1, "i-new1", "10.0.0.3", time.time()).to_json())

    def get_bytes(self, key: str) -> bytes | None:
        if key == gang.RANKS_KEY:
            self.reads += 1
            if self.reads_before is not None and self.reads > self.reads_before:
                self.put_text(gang.RANKS_KEY, gang.ranks_json(["i-new0", "i-new1"]))
        return super().get_bytes(key)


def test_an_agent_up_before_its_gang_is_ranked_waits_past_the_earlier_gangs_ranks() -> None:
    folder, notes = Relaunch(reads_before=2), []
    joined, ended = join(
        replace(spec(num_nodes=2), gang_timeout_s=60), folder, "i-new0", None, notes.append, lambda: None
    )
    assert ended is None, ended
    assert joined.node_rank == 0 and joined.env["CLOUDTRAIN_NUM_NODES"] == "2"
    assert joined.env["CLOUDTRAIN_NODE_IPS"].split("\n")[1] == "10.0.0.3"  # this gang's peer
    assert [n for n in notes if "does not name i-new0" in n] == [
        f"gang: {gang.RANKS_KEY} does not name i-new0 (an earlier gang's?); waiting"
    ]


def test_ranks_that_never_name_the_agent_end_its_wait_at_the_gang_timeout_naming_them() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    joined, ended = join(
        replace(spec(num_nodes=2), gang_timeout_s=3),
        Relaunch(None),
        "i-new0",
        None,
        [].append,
        lambda: None,
        clock,
    )
    assert ended is not None
    assert ended[2] == "gang barrier: i-new0 is not a node of ['i-old0', 'i-old1'] after 3 s"
