"""``airflow_cloudtrain.checkpoint`` (the job's side) and the agent's ``CheckpointSync`` over an
in-memory run folder: atomic saves, what counts as a complete checkpoint, what gets uploaded when, and
which step a restore picks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_cloudtrain import checkpoint
from airflow_cloudtrain.agent.checkpoints import CheckpointSync
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder

REPO = Path(__file__).resolve().parents[2]


# -- step_of / skip rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("ckpt-00042.pt", 42),
        ("step-00042", 42),
        ("model-7.tar.gz", 7),
        ("weights.v2-00010.safetensors", 10),
        ("ckpt.00003", 3),
        ("epoch-3-step-100.pt", 100),
        ("dir/ckpt-5.pt", 5),
        ("best.pt", None),
        ("x.h5", None),
        ("config.json", None),
        ("ckpt-00042-final.pt", None),
        (".ckpt-00042.pt.tmp", None),
        ("ckpt-00042.pt.tmp", None),
        (".step-00042", None),
        ("", None),
    ],
)
def test_step_of(name: str, step: int | None) -> None:
    assert checkpoint.step_of(name) == step


def test_skipped_names() -> None:
    assert (
        checkpoint.skipped(".hidden") and checkpoint.skipped("a.pt.tmp") and checkpoint.skipped(".complete")
    )
    assert not checkpoint.skipped("ckpt-1.pt") and not checkpoint.skipped("step-1")


# -- save ---------------------------------------------------------------------------------------


def test_save_writes_through_a_temp_name_then_replaces(tmp_path: Path) -> None:
    seen: list[tuple[Path, bool]] = []

    def write(tmp: Path) -> None:
        seen.append((tmp, (tmp_path / "ckpt-00001.pt").exists()))
        tmp.write_bytes(b"state-1")

    assert checkpoint.save(tmp_path / "ckpt-00001.pt", write) == tmp_path / "ckpt-00001.pt"
    assert seen == [(tmp_path / ".ckpt-00001.pt.tmp", False)]  # same directory, hidden, .tmp
    assert (tmp_path / "ckpt-00001.pt").read_bytes() == b"state-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00001.pt"]
    # overwriting: the old file stays whole until the new one replaces it
    checkpoint.save(tmp_path / "ckpt-00001.pt", lambda tmp: tmp.write_bytes(b"state-1b"))
    assert (tmp_path / "ckpt-00001.pt").read_bytes() == b"state-1b"
    checkpoint.save(tmp_path / "sub" / "ckpt-2.pt", lambda tmp: tmp.write_text("x"))  # makes the dir
    assert (tmp_path / "sub" / "ckpt-2.pt").read_text() == "x"


def test_save_crash_in_write_fn_leaves_no_file_and_no_partial(tmp_path: Path) -> None:
    (tmp_path / "ckpt-00001.pt").write_bytes(b"old")

    def crash(tmp: Path) -> None:
        tmp.write_bytes(b"half a checkp")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        checkpoint.save(tmp_path / "ckpt-00002.pt", crash)
    with pytest.raises(RuntimeError):
        checkpoint.save(tmp_path / "ckpt-00001.pt", crash)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00001.pt"]
    assert (tmp_path / "ckpt-00001.pt").read_bytes() == b"old"  # untouched
    with pytest.raises(FileNotFoundError):  # write_fn that writes nothing is an error, not a checkpoint
        checkpoint.save(tmp_path / "ckpt-00003.pt", lambda tmp: None)
    assert checkpoint.latest(tmp_path) == tmp_path / "ckpt-00001.pt"


def test_process_killed_inside_save_leaves_only_the_skipped_temp(tmp_path: Path) -> None:
    """A real crash (the process dies in write_fn): a ``.tmp`` dot-file stays, which nothing counts."""
    code = (
        "import os, sys\n"
        "from airflow_cloudtrain import checkpoint\n"
        "def write(tmp):\n"
        "    tmp.write_bytes(b'partial')\n"
        "    os._exit(9)\n"
        "checkpoint.save(sys.argv[1], write)\n"
    )
    checkpoint.save(tmp_path / "ckpt-00001.pt", lambda tmp: tmp.write_bytes(b"one"))
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ckpt-00002.pt")], cwd=REPO, timeout=120
    )
    assert done.returncode == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt-00002.pt.tmp", "ckpt-00001.pt"]
    assert checkpoint.latest(tmp_path) == tmp_path / "ckpt-00001.pt"


# -- latest -------------------------------------------------------------------------------------


def test_latest_on_files(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path / "missing") is None
    assert checkpoint.latest(tmp_path) is None
    for step in (3, 12, 7):
        checkpoint.save(tmp_path / f"ckpt-{step:05d}.pt", lambda tmp: tmp.write_text("x"))
    (tmp_path / ".ckpt-00099.pt.tmp").write_text("partial")  # a save in progress / crashed
    (tmp_path / "ckpt-00050.pt.tmp").write_text("partial")
    (tmp_path / "config.json").write_text("{}")  # no step: not a checkpoint
    assert checkpoint.latest(tmp_path) == tmp_path / "ckpt-00012.pt"  # by step, not by name or time
    assert [step for step, _ in checkpoint.candidates(tmp_path)] == [3, 7, 12]


def test_latest_on_step_directories(tmp_path: Path) -> None:
    (tmp_path / "step-00010").mkdir()
    (tmp_path / "step-00010" / "model.pt").write_text("m")
    assert checkpoint.latest(tmp_path) is None  # no marker, nothing later: maybe still being written
    checkpoint.mark_complete(tmp_path / "step-00010")
    assert checkpoint.latest(tmp_path) == tmp_path / "step-00010"
    (tmp_path / "step-00020").mkdir()  # being written
    assert checkpoint.latest(tmp_path) == tmp_path / "step-00010"
    (tmp_path / "step-00015").mkdir()  # no marker but a later step directory exists: complete
    assert checkpoint.latest(tmp_path) == tmp_path / "step-00015"
    checkpoint.mark_complete(tmp_path / "step-00020")
    assert checkpoint.latest(tmp_path) == tmp_path / "step-00020"
    (tmp_path / ".step-00030").mkdir()  # hidden: never a checkpoint
    checkpoint.save(tmp_path / "ckpt-00025.pt", lambda tmp: tmp.write_text("f"))  # files and dirs mix
    assert checkpoint.latest(tmp_path) == tmp_path / "ckpt-00025.pt"


# -- the agent's sync and restore over an in-memory run folder -------------------------------------


class MemoryFolder(RunFolder):
    """The RunFolder calls CheckpointSync makes, in a dict; records every upload."""

    def __init__(self) -> None:
        super().__init__("s3://bucket/runs/x/-1")
        self.objects: dict[str, bytes] = {}
        self.uploaded: list[str] = []

    def put_bytes(self, key: str, data: bytes) -> None:
        self.objects[key] = data
        self.uploaded.append(key)

    def get_bytes(self, key: str) -> bytes | None:
        return self.objects.get(key)

    def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def upload_file(self, local_path: str | os.PathLike[str], key: str) -> None:
        self.put_bytes(key, Path(local_path).read_bytes())

    def download(self, key_or_uri: str, local_path: str | os.PathLike[str]) -> None:
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        Path(local_path).write_bytes(self.objects[key_or_uri])

    def delete_key(self, key: str) -> None:
        self.objects.pop(key, None)

    def delete_prefix(self, prefix: str = "") -> int:
        gone = [k for k in self.objects if k.startswith(prefix.strip("/") + "/")]
        for key in gone:
            del self.objects[key]
        return len(gone)


def _sync(folder: MemoryFolder, local: Path, notes: list[str] | None = None) -> CheckpointSync:
    sink = notes if notes is not None else []
    return CheckpointSync(folder, local, "i-1", note=sink.append, call=lambda fn, what: fn(), settle_s=0.0)


def _manifest(folder: MemoryFolder, version: int) -> runs.Manifest:
    return runs.Manifest.from_json(folder.objects[runs.manifest_key(version)].decode())


def _sent(folder: MemoryFolder) -> list[str]:
    return [k for k in folder.uploaded if k != runs.LEFT_OUT_KEY]


def test_sync_uploads_the_newest_complete_checkpoint_manifest_last(tmp_path: Path) -> None:
    folder, notes = MemoryFolder(), []
    sync = _sync(folder, tmp_path, notes)
    assert sync.sync() is None and folder.uploaded == []  # nothing yet
    for step in (1, 2):
        checkpoint.save(tmp_path / f"ckpt-{step:05d}.pt", lambda tmp, s=step: tmp.write_bytes(b"s%d" % s))
    (tmp_path / ".ckpt-00003.pt.tmp").write_bytes(b"partial")
    assert sync.sync() == 2
    assert _sent(folder) == ["checkpoints/1/ckpt-00002.pt", "checkpoints/1/MANIFEST.json"]  # manifest last
    manifest = _manifest(folder, 1)
    assert manifest.step == 2 and manifest.instance_id == "i-1" and manifest.created_at
    assert manifest.layout == "steps" and manifest.version == 2
    assert manifest.files == [
        {"path": "ckpt-00002.pt", "size": 2, "sha256": hashlib.sha256(b"s2").hexdigest()}
    ]
    assert notes[-1].startswith("checkpoint step 2 uploaded to s3://bucket/runs/x/-1/checkpoints/1 (steps")
    assert sync.sync() is None and len(_sent(folder)) == 2  # unchanged: nothing sent again
    os.utime(tmp_path / "ckpt-00002.pt", ns=(1, 1))  # touched, same bytes: still nothing
    assert sync.sync() is None and len(_sent(folder)) == 2
    checkpoint.save(tmp_path / "ckpt-00002.pt", lambda tmp: tmp.write_bytes(b"s2-again"))  # rewritten
    assert sync.sync() == 2
    assert _sent(folder)[2:] == ["checkpoints/2/ckpt-00002.pt", "checkpoints/2/MANIFEST.json"]
    assert _manifest(folder, 2).files[0]["size"] == 8


def test_sync_step_directory_only_when_complete_and_only_changed_files(tmp_path: Path) -> None:
    folder = MemoryFolder()
    sync = _sync(folder, tmp_path)
    step4 = tmp_path / "step-00004"
    step4.mkdir()
    (step4 / "model.pt").write_bytes(b"model-4")
    (step4 / "optim.pt").write_bytes(b"optim-4")
    assert sync.sync() is None and _sent(folder) == []  # incomplete: no marker, nothing later
    left = json.loads(folder.objects[runs.LEFT_OUT_KEY])  # said for a relaunch that finds nothing
    assert left["pending"] == [["step-00004/", "no .complete marker and no later step directory"]]
    checkpoint.mark_complete(step4)
    (step4 / ".model.pt.tmp").write_bytes(b"junk")
    (step4 / "notes.tmp").write_bytes(b"junk")
    assert sync.sync() == 4
    assert _sent(folder) == [
        "checkpoints/1/step-00004/.complete",
        "checkpoints/1/step-00004/model.pt",
        "checkpoints/1/step-00004/optim.pt",
        "checkpoints/1/MANIFEST.json",
    ]
    assert runs.LEFT_OUT_KEY not in folder.objects  # everything is kept now
    (step4 / "optim.pt").write_bytes(b"optim-4b")  # one file changed: only it goes, and a manifest
    folder.uploaded.clear()
    assert sync.sync() == 4
    assert _sent(folder) == ["checkpoints/2/step-00004/optim.pt", "checkpoints/2/MANIFEST.json"]
    files = {f["path"]: f for f in _manifest(folder, 2).files}
    assert files["step-00004/model.pt"]["key"] == "checkpoints/1/step-00004/model.pt"  # not sent again
    assert "key" not in files["step-00004/optim.pt"]


def test_old_versions_are_pruned_but_what_a_kept_one_points_at_stays(tmp_path: Path) -> None:
    folder = MemoryFolder()
    sync = _sync(folder, tmp_path)
    (tmp_path / "vocab.json").write_text("{}")  # written once, kept by every version
    for n in range(1, 5):
        (tmp_path / "state.json").write_text(json.dumps({"epoch": n}))
        assert sync.sync() is None and sync.last_manifest is not None  # a snapshot: no step
        assert sync.last_manifest.layout == "files"
    assert runs.manifest_versions(folder.list("checkpoints/")) == [3, 4]  # the newest two
    assert folder.list("checkpoints/1/") == ["checkpoints/1/vocab.json"]  # still pointed at
    assert not folder.list("checkpoints/2/")
    restored = _sync(folder, tmp_path / "new").restore()
    assert restored is not None and (restored.version, restored.step, restored.layout) == (4, None, "files")
    assert json.loads((tmp_path / "new" / "state.json").read_text()) == {"epoch": 4}
    assert (tmp_path / "new" / "vocab.json").read_text() == "{}"


def test_sync_clears_leftovers_of_a_killed_upload(tmp_path: Path) -> None:
    folder = MemoryFolder()
    folder.objects["checkpoints/6/ckpt-00006.pt"] = b"partial from a killed agent"
    folder.objects["checkpoints/6/stale.bin"] = b"stale"
    checkpoint.save(tmp_path / "ckpt-00006.pt", lambda tmp: tmp.write_bytes(b"six"))
    assert _sync(folder, tmp_path).sync() == 6
    assert folder.list("checkpoints/") == ["checkpoints/7/MANIFEST.json", "checkpoints/7/ckpt-00006.pt"]


def _put_step(folder: MemoryFolder, step: int, files: dict[str, bytes], manifest: bool = True) -> None:
    """A version as the previous release wrote it: numbered by its step, manifest format 1."""
    entries = []
    for rel, data in files.items():
        folder.objects[f"checkpoints/{step}/{rel}"] = data
        entries.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    if manifest:
        text = runs.Manifest(step=step, files=entries, created_at=1.0, instance_id="i-0").to_json()
        folder.objects[runs.manifest_key(step)] = text.encode()


def test_restore_picks_the_newest_verified_version(tmp_path: Path) -> None:
    folder, notes = MemoryFolder(), []
    _put_step(folder, 3, {"step-00003/model.pt": b"m3", "step-00003/optim.pt": b"o3"})
    _put_step(folder, 4, {"ckpt-00004.pt": b"four"})
    folder.objects["checkpoints/4/ckpt-00004.pt"] = b"FOUR"  # same size, wrong bytes
    _put_step(folder, 5, {"ckpt-00005.pt": b"five"}, manifest=False)  # killed mid-upload
    _put_step(folder, 6, {"ckpt-00006.pt": b"six"})
    del folder.objects["checkpoints/6/ckpt-00006.pt"]  # manifest lists a file that is not there
    folder.objects[runs.manifest_key(7)] = b"{not json"
    sync = _sync(folder, tmp_path / "ckpt", notes)
    restored = sync.restore()
    assert restored is not None and (restored.version, restored.step) == (3, 3)
    local = tmp_path / "ckpt"
    assert (local / "step-00003" / "model.pt").read_bytes() == b"m3"
    assert (local / "step-00003" / checkpoint.COMPLETE_MARKER).is_file()  # our convention: latest() sees it
    assert checkpoint.latest(local) == local / "step-00003"
    assert sorted(p.name for p in local.iterdir()) == ["step-00003"]  # no staging left behind
    assert [n.split(":")[0] for n in notes[:3]] == [
        "skipping checkpoint version 7",
        "skipping checkpoint version 6",
        "skipping checkpoint version 4",
    ]
    assert notes[3:] == ["restored checkpoint step 3 from s3://bucket/runs/x/-1/checkpoints/3 (steps)"]
    assert "sha256" in notes[2]
    uploads = len(folder.uploaded)
    assert sync.sync() is None and len(folder.uploaded) == uploads  # restored: not sent back
    checkpoint.save(local / "ckpt-00009.pt", lambda tmp: tmp.write_bytes(b"nine"))
    assert sync.sync() == 9 and runs.manifest_key(8) in folder.objects  # after every version seen


def test_restore_with_nothing_or_an_unsafe_manifest(tmp_path: Path) -> None:
    folder, notes = MemoryFolder(), []
    sync = _sync(folder, tmp_path / "a", notes)
    assert sync.restore() is None and notes == []
    assert sync.restore_note is not None and "ever uploaded" in sync.restore_note
    _put_step(folder, 2, {"../escape.pt": b"x"})
    sync = _sync(folder, tmp_path / "b", notes)
    assert sync.restore() is None
    assert "unsafe path" in notes[-1] and not (tmp_path / "escape.pt").exists()
    assert sync.restore_note is not None and "could be verified" in sync.restore_note


def test_restore_keeps_a_newer_local_checkpoint(tmp_path: Path) -> None:
    folder, notes = MemoryFolder(), []
    _put_step(folder, 3, {"ckpt-00003.pt": b"three"})
    checkpoint.save(tmp_path / "ckpt-00008.pt", lambda tmp: tmp.write_bytes(b"eight"))
    assert _sync(folder, tmp_path, notes).restore() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00008.pt"]
    assert "already holds" in notes[-1]


def test_manifest_and_layout_helpers() -> None:
    assert runs.checkpoint_prefix(42) == "checkpoints/42"
    assert runs.manifest_key(42) == "checkpoints/42/MANIFEST.json"
    assert runs.checkpoint_step("checkpoints/42/step-1/a.pt") == 42
    assert runs.checkpoint_step("checkpoints/x/a") is None and runs.checkpoint_step("results/1/a") is None
    with pytest.raises(ValueError):
        runs.checkpoint_prefix(-1)
    manifest = runs.Manifest(step=1, files=[{"path": "a", "size": 1, "sha256": "ab"}], created_at=2.0)
    assert runs.Manifest.from_json(manifest.to_json()) == manifest
    with pytest.raises(ValueError):
        runs.Manifest.from_json('{"step": 1, "files": [{"path": "a"}]}')
    spec = runs.RunSpec(run_id="r", run_uri="s3://b/r", cloud="ec2", command="true")
    assert (spec.checkpoint_dir, spec.checkpoint_interval_s, spec.restarts) == (None, 300.0, 0)
    spec.checkpoint_dir, spec.restarts = "/mnt/data/ckpt", 2
    assert runs.RunSpec.from_json(spec.to_json()) == spec
