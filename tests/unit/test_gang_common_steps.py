"""``checkpoint_ranks="all"``: every rank of a relaunched gang restores the newest step that every rank
has a complete checkpoint of, so a data-parallel job never goes on with ranks at different steps (the
lost node's last upload may be older than the others'). Real ``CheckpointSync`` uploads into an
in-memory bucket whose ``at()`` views are the ranks' folders, as ``agent.gang.checkpoint_folder``
opens them."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_cloudtrain import checkpoint
from airflow_cloudtrain.agent.checkpoints import CheckpointSync
from airflow_cloudtrain.agent.gang import checkpoint_folder, common_steps, merge_ranks
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder


class Bucket(RunFolder):
    """One dict for the whole bucket; each folder (``at()`` copies share it) sees its own prefix."""

    def __init__(self, uri: str = "s3://bucket/runs/x/-1") -> None:
        super().__init__(uri)
        self.objects: dict[str, bytes] = {}

    def _full(self, key: str) -> str:
        return f"{self.base}/{key}" if self.base else key

    def put_bytes(self, key: str, data: bytes) -> None:
        self.objects[self._full(key)] = data

    def get_bytes(self, key: str) -> bytes | None:
        return self.objects.get(self._full(key))

    def list(self, prefix: str = "") -> list[str]:
        start = self._full(prefix)
        cut = len(self._full(""))
        return sorted(k[cut:] for k in self.objects if k.startswith(start))

    def upload_file(self, local_path: str | os.PathLike[str], key: str) -> None:
        self.put_bytes(key, Path(local_path).read_bytes())

    def download(self, key_or_uri: str, local_path: str | os.PathLike[str]) -> None:
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        Path(local_path).write_bytes(self.objects[self._full(key_or_uri)])

    def delete_key(self, key: str) -> None:
        self.objects.pop(self._full(key), None)

    def delete_prefix(self, prefix: str = "") -> int:
        gone = [k for k in self.objects if k.startswith(self._full(prefix.strip("/") + "/"))]
        for key in gone:
            del self.objects[key]
        return len(gone)


def spec(num_nodes: int = 3, ranks: str = "all") -> runs.RunSpec:
    return runs.RunSpec(
        run_id="ct-x", run_uri="s3://bucket/runs/x/-1", cloud="ec2spot", command="true",
        num_nodes=num_nodes, checkpoint_ranks=ranks,
    )  # fmt: skip


def upload(bucket: Bucket, s: runs.RunSpec, rank: int, steps: list[int], tmp: Path) -> None:
    """Rank ``rank``'s agent uploading a checkpoint after each of ``steps``."""
    local = tmp / f"rank{rank}"
    local.mkdir()
    sync = CheckpointSync(
        checkpoint_folder(bucket, s, rank), local, f"i-{rank}", note=lambda _: None,
        call=lambda fn, what: fn(), settle_s=0.0,
    )  # fmt: skip
    for step in steps:
        checkpoint.save(
            local / f"ckpt-{step:05d}.pt", lambda t, s=step, r=rank: t.write_bytes(b"r%ds%d" % (r, s))
        )
        assert sync.sync() == step


def restore(bucket: Bucket, s: runs.RunSpec, rank: int, tmp: Path, notes: list[str]) -> int | None:
    """A relaunched rank's restore, as ``agent.runner`` does it."""
    local = tmp / f"new{rank}"
    sync = CheckpointSync(
        checkpoint_folder(bucket, s, rank), local, f"i-new{rank}", note=notes.append,
        call=lambda fn, what: fn(), settle_s=0.0,
    )  # fmt: skip
    restored = sync.restore(common_steps(bucket, s, notes.append))
    if restored is None:
        return None
    assert (local / f"ckpt-{restored.step:05d}.pt").read_bytes() == b"r%ds%d" % (rank, restored.step)
    return restored.step


def test_every_rank_restores_the_newest_step_they_all_have(tmp_path: Path) -> None:
    bucket, s, notes = Bucket(), spec(), []
    upload(bucket, s, 0, [10, 20, 30], tmp_path)
    upload(bucket, s, 1, [10, 20, 30], tmp_path)
    upload(bucket, s, 2, [10, 20], tmp_path)  # the lost node: its step 30 never went up
    assert common_steps(bucket, s, notes.append) == {20}  # the older versions were pruned
    assert [restore(bucket, s, r, tmp_path, notes) for r in range(3)] == [20, 20, 20]
    assert "gang: the ranks' newest checkpoints differ (rank 0: 30, rank 1: 30, rank 2: 20); every rank " \
        "restores step 20, the newest they all have" in notes  # fmt: skip


def test_ranks_with_no_step_in_common_all_start_without_a_checkpoint(tmp_path: Path) -> None:
    bucket, s, notes = Bucket(), spec(num_nodes=2), []
    upload(bucket, s, 0, [10], tmp_path)
    upload(bucket, s, 1, [5], tmp_path)
    assert [restore(bucket, s, r, tmp_path, notes) for r in range(2)] == [None, None]
    assert any("no step is common to every rank" in n for n in notes)


def test_no_rule_for_the_head_only_layout_or_a_first_gang(tmp_path: Path) -> None:
    bucket = Bucket()
    assert common_steps(bucket, spec(), lambda _: None) is None  # nothing uploaded yet
    upload(bucket, spec(ranks="head"), 0, [10, 20], tmp_path)
    assert common_steps(bucket, spec(ranks="head"), lambda _: None) is None  # every rank: the head's


def dcp_save(local: Path, step: int, rank: int, coordinator: bool) -> None:
    """What ``torch.distributed.checkpoint.save`` leaves on one node: its rank's data file, and on the
    coordinator's node ``.metadata`` (written last, through ``.metadata.tmp`` and a rename)."""
    step_dir = local / f"step-{step:05d}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / f"__{rank}_0.distcp").write_bytes(b"shard r%d s%d" % (rank, step))
    if coordinator:
        (step_dir / ".metadata.tmp").write_bytes(b"meta s%d" % step)
        os.replace(step_dir / ".metadata.tmp", step_dir / ".metadata")


def test_a_sharded_dcp_step_is_uploaded_by_every_node_and_restored_whole_on_each(tmp_path: Path) -> None:
    """DCP over two nodes, each saving into its own disk: node 1's step directories never get a
    ``.metadata`` (the coordinator's), yet its shard goes up once stable; on a relaunch both nodes get
    the newest step every node has, with both shards and the coordinator's ``.metadata``."""
    bucket, s, notes = Bucket(), spec(num_nodes=2), []
    syncs = {}
    for rank in (0, 1):
        local = tmp_path / f"rank{rank}"
        local.mkdir()
        syncs[rank] = CheckpointSync(
            checkpoint_folder(bucket, s, rank), local, f"i-{rank}", note=lambda _: None,
            call=lambda fn, what: fn(), settle_s=0.0, dcp_shards=rank > 0,
        )  # fmt: skip
        dcp_save(local, 10, rank, coordinator=rank == 0)
        assert syncs[rank].sync() == 10, rank
    dcp_save(tmp_path / "rank1", 20, 1, coordinator=False)  # node 1 wrote step 20; node 0 was lost first
    assert syncs[1].sync() == 20
    # without the rule, a shard-only directory waits for a .metadata that never comes
    plain = CheckpointSync(Bucket(), tmp_path / "rank1", "i-x", call=lambda fn, what: fn(), settle_s=0.0)
    assert plain.sync() is None
    assert common_steps(bucket, s, notes.append) == {10}
    for rank in (0, 1):
        local = tmp_path / f"new{rank}"
        sync = CheckpointSync(
            checkpoint_folder(bucket, s, rank), local, f"i-new{rank}", note=notes.append,
            call=lambda fn, what: fn(), settle_s=0.0, dcp_shards=rank > 0,
        )  # fmt: skip
        restored = sync.restore(common_steps(bucket, s, notes.append))
        assert restored is not None and restored.step == 10
        merge_ranks(bucket, s, rank, restored, sync, notes.append)
        step_dir = local / "step-00010"
        assert sorted(p.name for p in step_dir.iterdir() if p.name != ".complete") == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
        ]
        assert (step_dir / ".metadata").read_bytes() == b"meta s10"
        assert (step_dir / f"__{1 - rank}_0.distcp").read_bytes() == b"shard r%d s10" % (1 - rank)
        before = len(bucket.objects)
        sync.sync()  # the other rank's files are theirs to upload: nothing new goes up from here
        assert len(bucket.objects) == before, rank
    assert "gang: added rank 0's 2 file(s) of DCP step 10" in notes
    assert "gang: added rank 1's 1 file(s) of DCP step 10" in notes
