"""Edge cases of the checkpoint layouts and the agent's sync / restore that a user hits: several files
of one step, an Orbax ``step_prefix`` with an underscore, version chains across restores, a persistent
checkpoint directory, manifests that point where they must not, names with spaces and unicode."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from test_checkpoint import MemoryFolder

from airflow_cloudtrain.agent.checkpoints import CheckpointSync
from airflow_cloudtrain.contract import checkpoint, runs
from airflow_cloudtrain.contract.checkpoint_layouts import plan


def _sync(folder: MemoryFolder, local: Path, notes: list[str] | None = None) -> CheckpointSync:
    sink = notes if notes is not None else []
    return CheckpointSync(folder, local, "i-1", note=sink.append, call=lambda fn, what: fn(), settle_s=0.0)


def _plan(names: list[str], read: dict[str, bytes] | None = None) -> tuple[int | None, list[str]]:
    found = plan(names, lambda rel: True, lambda rel: (read or {}).get(rel))
    return found.step, sorted(found.files)


def test_every_file_of_the_newest_step_is_taken() -> None:
    """``model_500.pt`` + ``optimizer_500.pt`` (one checkpoint, two files): both, not one of them."""
    names = ["model_400.pt", "optimizer_400.pt", "model_500.pt", "optimizer_500.pt"]
    assert _plan(names) == (500, ["model_500.pt", "optimizer_500.pt"])
    # a file and a complete directory of the same step: both belong to it
    names = ["step-5/a.bin", "step-5/.complete", "ckpt-5.pt", "ckpt-4.pt"]
    assert _plan(names) == (5, ["ckpt-5.pt", "step-5/.complete", "step-5/a.bin"])


def test_orbax_step_prefix_may_hold_underscores() -> None:
    names = [
        "my_ckpt_4/default/a",
        "my_ckpt_4/_CHECKPOINT_METADATA",
        "my_ckpt_5/default/a",
        "my_ckpt_5/_CHECKPOINT_METADATA",
    ]
    found = plan(names, lambda rel: True, lambda rel: None)
    assert (found.step, found.layout) == (5, "orbax")
    assert found.files == ["my_ckpt_5/_CHECKPOINT_METADATA", "my_ckpt_5/default/a"]


def test_chains_of_reuse_survive_restores_uploads_and_pruning(tmp_path: Path) -> None:
    """A file written once is kept by every later version through its first object, across a restore
    on a new instance; pruning never deletes what a kept manifest points at; the restored files are
    not sent again."""
    folder, local = MemoryFolder(), tmp_path / "a"
    local.mkdir()
    sync = _sync(folder, local)
    (local / "vocab.json").write_text("{}")
    for step in (1, 2, 3):
        checkpoint.save(local / f"ckpt-{step}.pt", lambda tmp, s=step: tmp.write_bytes(b"s%d" % s))
        assert sync.sync() == step
    second = _sync(folder, tmp_path / "b")
    restored = second.restore()
    assert restored is not None and (restored.version, restored.step) == (3, 3)
    sent = len(folder.uploaded)
    assert second.sync() is None and len(folder.uploaded) == sent  # nothing sent back
    for step in (4, 5, 6):
        new = tmp_path / "b" / f"ckpt-{step}.pt"
        checkpoint.save(new, lambda tmp, s=step: tmp.write_bytes(b"s%d" % s))
        assert second.sync() == step
    assert runs.manifest_versions(folder.list("checkpoints/")) == [5, 6]
    assert [k for k in folder.uploaded[sent:] if "vocab" in k] == []  # never sent again
    third = _sync(folder, tmp_path / "c")
    assert third.restore() is not None
    assert (tmp_path / "c" / "vocab.json").read_text() == "{}"
    assert checkpoint.latest(tmp_path / "c") == tmp_path / "c" / "ckpt-6.pt"


def test_restore_refuses_a_key_outside_its_checkpoints_folder(tmp_path: Path) -> None:
    folder, notes = MemoryFolder(), list[str]()
    data = b"secret"
    folder.objects["results/i-0/secret.txt"] = data
    folder.objects["checkpoints/1/../../results/i-0/secret.txt"] = data  # what a ".." key would reach
    for version, key in ((1, "results/i-0/secret.txt"), (2, "checkpoints/1/../../results/i-0/secret.txt")):
        entry = {
            "path": "ckpt-1.pt",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "key": key,
        }
        manifest = runs.Manifest(step=1, files=[entry], created_at=1.0, version=2)
        folder.objects[runs.manifest_key(version)] = manifest.to_json().encode()
    sync = _sync(folder, tmp_path / "ckpt", notes)
    assert sync.restore() is None
    assert [n.split(":")[0] for n in notes] == [
        "skipping checkpoint version 2",
        "skipping checkpoint version 1",
    ]
    assert not (tmp_path / "ckpt" / "ckpt-1.pt").exists()


def test_restore_over_a_persistent_directory_without_a_step_checkpoint(tmp_path: Path) -> None:
    """A persistent volume that holds only newer loose files (a tokenizer) but no step checkpoint: the
    run folder's step checkpoint is still restored."""
    folder, notes = MemoryFolder(), list[str]()
    first = tmp_path / "a"
    checkpoint.save(first / "ckpt-7.pt", lambda tmp: tmp.write_bytes(b"seven"))
    assert _sync(folder, first).sync() == 7
    local = tmp_path / "b"
    local.mkdir()
    (local / "tokenizer.json").write_text("{}")  # newer than the checkpoint, no step
    restored = _sync(folder, local, notes).restore()
    assert restored is not None and restored.step == 7, notes
    assert checkpoint.latest(local) == local / "ckpt-7.pt"


def test_names_with_spaces_and_unicode_round_trip(tmp_path: Path) -> None:
    folder, local = MemoryFolder(), tmp_path / "a"
    step = local / "stép ü – 3"
    step.mkdir(parents=True)
    (step / "modèle poids.bin").write_bytes(b"w")
    checkpoint.mark_complete(step)
    (local / "notes é.json").write_text(json.dumps({"x": 1}))
    assert _sync(folder, local).sync() == 3
    restored = _sync(folder, tmp_path / "b").restore()
    assert restored is not None and restored.step == 3
    assert (tmp_path / "b" / "stép ü – 3" / "modèle poids.bin").read_bytes() == b"w"
    assert (tmp_path / "b" / "notes é.json").is_file()


def test_orbax_keeps_the_hidden_files_of_its_arrays(tmp_path: Path) -> None:
    """Orbax without OCDBT (TensorStore zarr) writes ``.zarray`` beside each array's chunks: part of
    the checkpoint (complete by its rename), so uploaded and restored, or the restore cannot load."""
    folder, local = MemoryFolder(), tmp_path / "a"
    for step in (4, 5):
        array = local / str(step) / "default" / "params.kernel"
        array.mkdir(parents=True)
        (array / ".zarray").write_text('{"shape": [2]}')
        (array / "0").write_bytes(b"chunk-%d" % step)
        (local / str(step) / "_CHECKPOINT_METADATA").write_text("{}")
    assert _sync(folder, local).sync() == 5
    restored = _sync(folder, tmp_path / "b").restore()
    assert restored is not None and (restored.step, restored.layout) == (5, "orbax")
    assert (tmp_path / "b" / "5" / "default" / "params.kernel" / ".zarray").read_text() == '{"shape": [2]}'


def test_lightning_last_as_a_link_is_kept_as_its_bytes(tmp_path: Path) -> None:
    """``ModelCheckpoint(save_last="link")``: ``last.ckpt`` is a symlink to the newest step file."""
    folder, local = MemoryFolder(), tmp_path / "a"
    local.mkdir()
    for step in (10, 20):
        (local / f"epoch=0-step={step}.ckpt").write_bytes(b"w%d" % step)
    (local / "last.ckpt").symlink_to("epoch=0-step=20.ckpt")
    (local / "dangling.ckpt").symlink_to("gone.ckpt")  # a link to nothing: not a file
    sync = _sync(folder, local)
    assert sync.sync() == 20
    assert sync.last_manifest is not None and sync.last_manifest.layout == "lightning"
    assert sorted(e["path"] for e in sync.last_manifest.files) == ["epoch=0-step=20.ckpt", "last.ckpt"]
    assert _sync(folder, tmp_path / "b").restore() is not None
    assert (tmp_path / "b" / "last.ckpt").read_bytes() == b"w20"


def test_tensorflow_shards_and_a_state_naming_a_missing_checkpoint() -> None:
    names = [
        "checkpoint",
        "ckpt-4.index",
        "ckpt-4.data-00000-of-00002",
        "ckpt-4.data-00001-of-00002",
        "ckpt-5.index",
        "ckpt-5.data-00000-of-00002",  # its second shard is not there
    ]
    state = {"checkpoint": b'model_checkpoint_path: "ckpt-6"\n'}  # names one that is not there at all
    found = plan(names, lambda rel: True, lambda rel: state.get(rel))
    assert (found.step, found.layout) == (4, "tensorflow")
    assert found.files == ["ckpt-4.data-00000-of-00002", "ckpt-4.data-00001-of-00002", "ckpt-4.index"]
    assert found.generated == {
        "checkpoint": b'model_checkpoint_path: "ckpt-4"\nall_model_checkpoint_paths: "ckpt-4"\n'
    }
    assert ("ckpt-5.index", "ckpt-5.data-00001-of-00002 is missing") in found.pending


def test_hugging_face_nested_directories_are_kept() -> None:
    state = {"checkpoint-8/trainer_state.json": json.dumps({"global_step": 8}).encode()}
    names = [
        "checkpoint-8/trainer_state.json",
        "checkpoint-8/global_step8/mp_rank_00_model_states.pt",
        "checkpoint-8/latest",
    ]
    found = plan(names, lambda rel: True, lambda rel: state.get(rel))
    assert (found.step, found.layout, sorted(found.files)) == (8, "huggingface", sorted(names))


def test_restore_next_to_an_older_checkpoint_on_a_persistent_volume(tmp_path: Path) -> None:
    """The volume still holds an older ``checkpoint-300/``: the run folder's newer one is restored
    beside it and the Trainer's rule picks the newer one."""
    from test_layout_rules import job

    folder, first, local = MemoryFolder(), tmp_path / "a", tmp_path / "b"
    first.mkdir()
    local.mkdir()
    job.SAVE["huggingface"](first, 500, False)
    assert _sync(folder, first).sync() == 500
    job.SAVE["huggingface"](local, 300, False)
    restored = _sync(folder, local).restore()
    assert restored is not None and restored.step == 500
    assert job.FIND["huggingface"](local) == 500


def test_a_step_file_written_in_place_by_a_killed_job_is_not_taken(tmp_path: Path) -> None:
    """``torch.save(state, f"{dir}/ckpt-{step}.pt")`` (in place, no rename) killed halfway: the name
    carries a step but the bytes are torn; the previous version stays the one restored."""
    import time

    folder, local = MemoryFolder(), tmp_path / "a"
    checkpoint.save(local / "ckpt-1.pt", lambda tmp: tmp.write_bytes(b"one"))
    sync = _sync(folder, local)
    assert sync.sync() == 1  # the last look while the job was alive
    (local / "ckpt-2.pt").write_bytes(b"tw")  # written in place, then the job is killed
    sync.job_ended(time.time(), killed=True)
    assert sync.sync() is None
    restored = _sync(folder, tmp_path / "b").restore()
    assert restored is not None and restored.step == 1
    # a job that exits by itself (its own SIGTERM handler) saved completely: taken
    other = _sync(MemoryFolder(), local)
    other.job_ended(time.time(), killed=False)
    assert other.sync() == 2


def test_a_job_that_died_before_the_agent_knew_never_uploads_its_torn_file(tmp_path: Path) -> None:
    """The job dies (SIGKILL) halfway through rewriting ``checkpoint.pt``; a periodic round looks
    before the agent has seen the death: the file is no longer open and looks settled, but it is
    torn. Nothing is uploaded then, and after ``job_ended`` the version the run folder had stays."""
    import signal
    import subprocess
    import sys

    from waiting import wait_for

    folder, local = MemoryFolder(), tmp_path / "ckpt"
    local.mkdir()
    whole = b"W" * 200_000
    (local / "checkpoint.pt").write_bytes(whole)
    sync = _sync(folder, local)
    sync.sync()
    first = sync.last_manifest
    assert first is not None
    writer = (
        "import sys, time\n"
        "f = open(sys.argv[1], 'r+b')\n"
        "f.write(b'T' * 50_000); f.flush()\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", writer, str(local / "checkpoint.pt")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        sync.job_started(job.pid)
        sync.sync()  # open for writing: the version the run folder has is kept
        assert sync.last_manifest is first
        job.send_signal(signal.SIGKILL)
        wait_for(lambda: not _alive(job.pid), timeout=60, message="the job to die")
        sync.sync()  # died, not reaped, not reported: a torn file that looks settled
        assert sync.last_manifest is first
    finally:
        job.kill()
        job.wait()
    sync.job_ended(time.time(), True)
    sync.sync()
    newest = max(runs.manifest_versions(folder.list(runs.CHECKPOINTS_PREFIX + "/")))
    manifest = runs.Manifest.from_json(str(folder.get_text(runs.manifest_key(newest))))
    entry = next(e for e in manifest.files if e["path"] == "checkpoint.pt")
    assert entry["sha256"] == hashlib.sha256(whole).hexdigest()


def _alive(pid: int) -> bool:
    from airflow_cloudtrain.agent.checkpoints import process_alive

    return process_alive(pid)


def test_a_checkpoint_pruned_or_replaced_while_it_uploads_still_goes_up_whole(tmp_path: Path) -> None:
    """A job whose saves come faster than one upload (a Trainer with ``save_total_limit=1``, our
    own ``checkpoint.save`` over one name) deletes or replaces the checkpoint the round is sending.
    The round sends the version it judged complete (it holds a hard link to it) and writes its
    manifest; nothing of the round is left in the checkpoint directory, nor what a killed agent's
    round left there."""
    folder, local = MemoryFolder(), tmp_path / "ckpt"
    local.mkdir()
    checkpoint.save(local / "ckpt-1.pt", lambda tmp: tmp.write_bytes(b"one"))
    (local / ".cloudtrain-upload-7").mkdir()  # an agent killed in the middle of a round left it
    (local / ".cloudtrain-upload-7" / "ckpt-0.pt").write_bytes(b"old")

    def job_prunes_meanwhile(fn: Callable[[], object], what: str) -> object:
        if what == "checkpoint upload" and (local / "ckpt-1.pt").exists():
            checkpoint.save(local / "ckpt-2.pt", lambda tmp: tmp.write_bytes(b"two"))
            (local / "ckpt-1.pt").unlink()
        return fn()

    sync = CheckpointSync(folder, local, "i-1", note=print, call=job_prunes_meanwhile, settle_s=0.0)
    assert sync.sync() == 1
    assert folder.objects[runs.join(runs.checkpoint_prefix(1), "ckpt-1.pt")] == b"one"
    assert sync.sync() == 2  # the next round takes the newer one
    assert runs.join(runs.checkpoint_prefix(1), "ckpt-0.pt") not in folder.objects

    # one name saved over (an atomic rename) while it goes up: the bytes sent are the judged version
    checkpoint.save(local / "state.pt", lambda tmp: tmp.write_bytes(b"epoch 1"))
    folder2 = MemoryFolder()

    def saved_over_meanwhile(fn: Callable[[], object], what: str) -> object:
        if what == "checkpoint upload":
            checkpoint.save(local / "state.pt", lambda tmp: tmp.write_bytes(b"epoch 2, longer"))
        return fn()

    sync2 = CheckpointSync(folder2, local, "i-2", note=print, call=saved_over_meanwhile, settle_s=0.0)
    sync2.sync()  # the first look: state.pt is new, so it is looked at again (settle_s=0)
    manifest = next(
        runs.Manifest.from_json(v.decode()) for k, v in folder2.objects.items() if k.endswith("MANIFEST.json")
    )
    sent = {e["path"]: e for e in manifest.files}
    key = runs.join(runs.checkpoint_prefix(1), "state.pt")
    assert hashlib.sha256(folder2.objects[key]).hexdigest() == sent["state.pt"]["sha256"]
    assert not [p for p in local.iterdir() if p.name.startswith(".cloudtrain-")]


def test_a_write_finished_after_the_last_round_is_not_torn_by_the_stop(tmp_path: Path) -> None:
    """A round looked while the Trainer was writing ``checkpoint-4/trainer_state.json`` (open for
    writing); the write finished; then the agent stopped the job and it died of the signal. The look
    ``job_stopping`` takes right before the signal shows the file closed: checkpoint-4 goes up. Without
    that look the last one seen alive is the round's, and checkpoint-4 would count as torn."""
    import subprocess
    import sys

    local = tmp_path / "ckpt"
    for step in (2, 4):
        (local / f"checkpoint-{step}").mkdir(parents=True)
        (local / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"w%d" % step)
    (local / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for stops in (True, False):
            folder = MemoryFolder()
            sync = _sync(folder, local)
            sync.job_started(job.pid)
            state = local / "checkpoint-4" / "trainer_state.json"
            state.unlink(missing_ok=True)
            with state.open("w") as writing:  # this process is "the job" writing it
                writing.write('{"global_step": 4}')
                writing.flush()
                assert sync.sync() == 2  # checkpoint-4's state file is open: step 2 goes up
            if stops:
                sync.job_stopping()  # the agent's look right before its SIGTERM
            sync.job_ended(time.time(), killed=True)
            assert sync.sync() == (4 if stops else None), stops
    finally:
        job.kill()
        job.wait()
