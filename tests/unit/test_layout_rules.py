"""The framework layouts of ``contract.checkpoint_layouts``, over the agent's real sync and restore.

Each layout is written by ``tests/cloud/jobs/layouts.py`` (the framework's names, write order and
temporary names, stdlib only), uploaded by ``CheckpointSync`` into an in-memory run folder, restored
into a fresh directory, and found there by the framework's own "latest" rule (re-implemented in that
file). In-between states (a save half done, a temporary directory, a state file not written yet)
must never be taken: the previous complete checkpoint stays the one restored.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

import pytest
from test_checkpoint import MemoryFolder

from airflow_cloudtrain.agent.checkpoints import CheckpointSync
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.contract.checkpoint_layouts import plan

JOB = Path(__file__).resolve().parents[1] / "cloud" / "jobs" / "layouts.py"


def _job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layouts_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


job = _job()
LAYOUTS = ["tensorflow", "lightning", "orbax", "huggingface", "overwrite"]


def _sync(folder: MemoryFolder, local: Path, notes: list[str] | None = None) -> CheckpointSync:
    sink = notes if notes is not None else []
    return CheckpointSync(folder, local, "i-1", note=sink.append, call=lambda fn, what: fn(), settle_s=0.0)


def _restore_into(folder: MemoryFolder, local: Path) -> CheckpointSync:
    sync = _sync(folder, local)
    sync.restore()
    return sync


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_round_trips_and_the_framework_finds_the_newest(layout: str, tmp_path: Path) -> None:
    local, folder = tmp_path / "job", MemoryFolder()
    local.mkdir()
    sync = _sync(folder, local)
    for step in (3, 6, 9, 12):
        job.SAVE[layout](local, step, False)
    sync.sync()
    manifest = sync.last_manifest
    step = None if layout == "overwrite" else 12  # files that carry no step: a snapshot
    assert manifest is not None and manifest.step == step
    assert manifest.layout == {"overwrite": "files"}.get(layout, layout)
    restored = _restore_into(folder, tmp_path / "new")
    assert restored.restored is not None and restored.restored.step == step
    assert job.FIND[layout](tmp_path / "new") == 12  # the framework's own rule finds it and it loads
    names = sorted(p.name for p in (tmp_path / "new").iterdir())
    if layout == "tensorflow":  # one checkpoint, all its files, and the state file naming it
        assert names == ["checkpoint", "ckpt-12.data-00000-of-00001", "ckpt-12.index"]
    if layout == "lightning":
        assert names == ["epoch=1-step=12.ckpt", "last.ckpt"]
    if layout in ("orbax", "huggingface"):  # as the framework wrote them: no marker of ours inside
        inside = tmp_path / "new" / ("12" if layout == "orbax" else "checkpoint-12")
        assert not [p for p in inside.rglob(".*")]


def test_the_state_tensorflow_writes_names_only_what_was_kept(tmp_path: Path) -> None:
    local, folder = tmp_path / "job", MemoryFolder()
    local.mkdir()
    for step in (1, 2, 3):
        job.save_tensorflow(local, step, False)
    assert "ckpt-1" in (local / "checkpoint").read_text()  # the job's own state lists three
    _sync(folder, local).sync()
    _restore_into(folder, tmp_path / "new")
    assert (tmp_path / "new" / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n'
    )


def _half_save(layout: str, d: Path, step: int) -> None:
    """The directory as a save of ``step`` leaves it when it dies halfway (the framework's order)."""
    data = job.blob(step)[: job.SIZE // 2]
    if layout == "tensorflow":
        (d / f"ckpt-{step}_temp").mkdir()
        (d / f"ckpt-{step}_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(data)
    elif layout == "lightning":
        (d / f"epoch={step // 10}-step={step}.ckpt").write_bytes(job.blob(step))
        (d / "last.ckpt").write_bytes(data)  # torn in place: the sync is told the job was killed
    elif layout == "orbax":
        tmp = d / f"{step}.orbax-checkpoint-tmp-1732000000000000"
        (tmp / "default").mkdir(parents=True)
        (tmp / "default" / "params.bin").write_bytes(data)
    elif layout == "huggingface":
        (d / f"checkpoint-{step}").mkdir()
        (d / f"checkpoint-{step}" / "model.safetensors").write_bytes(data)
    else:
        (d / "checkpoint.pt").write_bytes(data)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_save_killed_halfway_is_never_taken(layout: str, tmp_path: Path) -> None:
    local, folder = tmp_path / "job", MemoryFolder()
    local.mkdir()
    sync = _sync(folder, local)
    job.SAVE[layout](local, 6, False)
    assert sync.sync() == 6 or sync.last_manifest is not None
    _half_save(layout, local, 9)
    sync.job_ended(os.stat(local).st_mtime + 0.5, killed=True)  # the job died while saving
    sync.sync()
    step = None if layout == "overwrite" else 6
    assert sync.last_manifest is not None and sync.last_manifest.step == step  # not the half-written 9
    new = tmp_path / "new"
    restored = _restore_into(folder, new)
    assert restored.restored is not None and restored.restored.step == step
    assert job.FIND[layout](new) == 6
    assert not [p for p in new.rglob("*") if "tmp" in p.name or p.name.endswith("_temp")]


def test_left_out_names_what_was_not_kept_for_the_next_attempt(tmp_path: Path) -> None:
    local, folder = tmp_path / "job", MemoryFolder()
    local.mkdir()
    (local / "checkpoint-3").mkdir()
    (local / "checkpoint-3" / "model.safetensors").write_bytes(b"m")  # the Trainer never finished it
    _sync(folder, local).sync()
    sync = _restore_into(folder, tmp_path / "new")
    assert sync.restored is None and sync.restore_note is not None
    assert "checkpoint-3/model.safetensors" in sync.restore_note
    assert "no trainer_state.json yet" in sync.restore_note


def test_snapshots_off_keeps_only_layouts_and_warns_once(tmp_path: Path) -> None:
    local, folder, notes = tmp_path / "job", MemoryFolder(), []
    local.mkdir()
    sync = CheckpointSync(
        folder, local, "i-1", note=notes.append, call=lambda fn, what: fn(), snapshots=False, settle_s=0.0
    )
    (local / "state.json").write_text("{}")
    job.save_huggingface(local, 5, False)
    sync.sync()
    sync.sync()
    assert sync.last_manifest is not None and sync.last_manifest.step == 5
    assert [f["path"] for f in sync.last_manifest.files if "/" not in f["path"]] == []  # no state.json
    warnings = [n for n in notes if n.startswith("WARNING")]
    assert len(warnings) == 1 and "state.json" in warnings[0]


@pytest.mark.parametrize(
    ("names", "step", "taken"),
    [
        # the table of issue 24: what the frameworks write, what is one checkpoint
        (
            ["checkpoint", "ckpt-5.index", "ckpt-5.data-00000-of-00001"],
            5,
            ["ckpt-5.data-00000-of-00001", "ckpt-5.index"],
        ),
        (["checkpoint.pt", "model.pt", "state.json"], None, ["checkpoint.pt", "model.pt", "state.json"]),
        (["epoch=3-step=1200.ckpt", "last.ckpt"], 1200, ["epoch=3-step=1200.ckpt", "last.ckpt"]),
        (
            ["4/_CHECKPOINT_METADATA", "4/default/a", "5.orbax-checkpoint-tmp-1732000000/default/a"],
            4,
            ["4/_CHECKPOINT_METADATA", "4/default/a"],
        ),
        (
            ["checkpoint-500/model.safetensors", "checkpoint-500/trainer_state.json"],
            500,
            ["checkpoint-500/model.safetensors", "checkpoint-500/trainer_state.json"],
        ),
    ],
)
def test_plan_of_the_issue_table(names: list[str], step: int | None, taken: list[str]) -> None:
    found = plan(names, lambda rel: True, lambda rel: json.dumps({"global_step": 500}).encode())
    assert found.step == step and found.files == taken


def test_plan_waits_for_files_being_written() -> None:
    names = ["checkpoint-500/model.safetensors", "checkpoint-500/trainer_state.json"]
    state = json.dumps({"global_step": 500}).encode()
    found = plan(names, lambda rel: not rel.endswith("trainer_state.json"), lambda rel: state)
    assert found.empty and found.pending == [("checkpoint-500/trainer_state.json", "still being written")]
    loose = plan(["state.json"], lambda rel: False, lambda rel: None, kept=lambda rel: True)
    assert loose.keep == ["state.json"] and not loose.files  # the version the run folder has stays


def test_a_lightning_step_file_newer_than_last_ckpt_is_not_its_step() -> None:
    """ModelCheckpoint saves ``epoch=0-step=4.ckpt`` then rewrites ``last.ckpt``: seen between the
    two, ``last.ckpt`` still holds step 2, which is what ``ckpt_path="last"`` resumes from."""
    names = ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    written = {"epoch=0-step=2.ckpt": 1, "last.ckpt": 2, "epoch=0-step=4.ckpt": 3}
    found = plan(names, lambda rel: True, lambda rel: None, mtime=written.get)
    assert found.step == 2 and found.files == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert [what for what, _ in found.pending] == ["epoch=0-step=4.ckpt"]
    written["last.ckpt"] = 4  # rewritten: step 4 is in it
    found = plan(names, lambda rel: True, lambda rel: None, mtime=written.get)
    assert found.step == 4 and found.files == ["epoch=0-step=4.ckpt", "last.ckpt"]


def test_restored_files_read_as_written_together(tmp_path: Path) -> None:
    """A restore downloads in path order, not the order the framework wrote: it must not make a
    restored step file look newer than the restored ``last.ckpt`` (names sorting after it)."""
    local, folder = tmp_path / "job", MemoryFolder()
    local.mkdir()
    (local / "model-step=6.ckpt").write_bytes(job.blob(6))
    (local / "last.ckpt").write_bytes(job.blob(6))
    _sync(folder, local).sync()
    again = _restore_into(folder, tmp_path / "new")
    again.sync()
    assert again.last_manifest is None  # the run folder already has exactly this: no new version


def test_versions_in_the_run_folder_helpers() -> None:
    keys = ["checkpoints/2/MANIFEST.json", "checkpoints/2/a", "checkpoints/10/a", "checkpoints/LEFT_OUT.json"]
    assert runs.manifest_versions(keys) == [2]


def test_a_dcp_step_directory_is_restored_with_its_hidden_metadata(tmp_path: Path) -> None:
    """``torch.distributed.checkpoint.save(sd, checkpoint_id="step-000040")`` as torch 2.11-2.13 writes
    it (seen on the GPU machine, docs/gpu_checks.md): ``__0_0.distcp`` in place, then ``.metadata.tmp``
    renamed to ``.metadata``, which ``dcp.load`` needs. The hidden name is DCP's, not a temporary one:
    it must be uploaded and restored, and the directory is complete without our ``.complete`` marker."""
    local, folder = tmp_path / "job", MemoryFolder()
    sync = _sync(folder, local)
    for step in (20, 40):
        d = local / f"step-{step:06d}"
        d.mkdir(parents=True)
        (d / "__0_0.distcp").write_bytes(job.blob(step))
        (d / ".metadata.tmp").write_bytes(b"pickled Metadata %d" % step)
        if step == 40:  # seen before the rename: not complete yet, step 20 is
            found = plan(job_files(local), lambda rel: True, lambda rel: None)
            assert found.step == 20 and found.layouts == ["dcp"]
            assert ("step-000040/", "no .metadata yet (DCP writes it last)") in found.pending
        os.replace(d / ".metadata.tmp", d / ".metadata")
    assert sync.sync() == 40
    manifest = sync.last_manifest
    assert manifest is not None and manifest.layout == "dcp"
    assert [f["path"] for f in manifest.files] == ["step-000040/.metadata", "step-000040/__0_0.distcp"]
    new = tmp_path / "new"
    restored = _restore_into(folder, new)
    assert restored.restored is not None and restored.restored.step == 40
    assert sorted(p.name for p in (new / "step-000040").iterdir()) == [".metadata", "__0_0.distcp"]


def job_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_orbax_0_12_temporary_directories_carry_no_timestamp(tmp_path: Path) -> None:
    """orbax-checkpoint 0.12 writes ``<step>.orbax-checkpoint-tmp/`` (with ``default.orbax-checkpoint-tmp/``
    inside, ``*.__lock`` files, and ``commit_success.txt`` last) and renames it to ``<step>/``; no
    ``-<timestamp>`` (seen with the real CheckpointManager, docs/gpu_checks.md). The in-flight
    directory is neither a step nor a loose file to snapshot."""
    local, folder = tmp_path / "job", MemoryFolder()
    final = ["_CHECKPOINT_METADATA", "commit_success.txt", "default/_METADATA", "default/manifest.ocdbt"]
    final += ["default/ocdbt.process_0/d/2eaefe1dbb691115b94cee94e85c349c", "default/commit_success.txt"]
    flight = ["_CHECKPOINT_METADATA", "default.orbax-checkpoint-tmp/_sharding.__lock"]
    flight += ["default.orbax-checkpoint-tmp/ocdbt.process_0/d/af1b2523e677ebaefbcbf4e212c3ca77"]
    for rel in [f"80/{n}" for n in final] + [f"100.orbax-checkpoint-tmp/{n}" for n in flight]:
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(rel.encode())
    found = plan(job_files(local), lambda rel: True, lambda rel: None)
    assert found.step == 80 and found.layouts == ["orbax"]
    assert found.files == sorted(f"80/{n}" for n in final)
    assert ("100.orbax-checkpoint-tmp", "a temporary name (being written)") in found.ignored
    assert _sync(folder, local).sync() == 80
    new = tmp_path / "new"
    assert _restore_into(folder, new).restored is not None
    assert sorted(p.name for p in new.iterdir()) == ["80"]
