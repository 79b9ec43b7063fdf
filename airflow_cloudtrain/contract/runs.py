"""The run folder: the only channel between the operator and the agent on the instance.

Layout under ``run_uri`` (``s3://bucket/prefix/runs/<dag>/<task>/<run>/<map_index>``)::

    spec.json                          RunSpec, written by the operator before launch
    agent/airflow_cloudtrain.zip       the agent code of the operator's version (the instance fetches it)
    code/code.tar.gz                   the user's ``code`` when it was a local directory
    instances/<instance-id>/status.json    agent: RunStatus, rewritten on every change
    instances/<instance-id>/heartbeat      agent: unix time, every few seconds (only without a live index)
    instances/<instance-id>/logs/<seq>.log log chunks, seq = 000000, 000001, ... in order; each line
                                       starts with the agent's UTC time (``2026-11-23T08:00:09.602Z ``)
    results/<instance-id>/...          the job's output dir (CLOUDTRAIN_OUTPUT_DIR), at the end; one
                                       folder per attempt, so a retry never mixes into a finished try
    checkpoints/<version>/...          checkpoint files; ``MANIFEST.json`` written last = complete;
                                       versions count up (an old release used the step as version)
    checkpoints/<version>/MANIFEST.json  Manifest: the files with size, sha256 and where the bytes
                                       are (an unchanged file points at an older version's object);
                                       a version without one (an agent killed mid-upload) is not a
                                       checkpoint. The newest two are kept, older ones deleted.
    checkpoints/LEFT_OUT.json          what the job's checkpoint directory held that was not kept
                                       (being written, temporary, incomplete), for the next attempt's
                                       warning when nothing could be restored

And one level up, shared by every run of a bucket (``live_index_uri(bucket)``), the live index that
lets one triggerer watch a thousand runs with one listing per poll (``triggers.run_index``)::

    _cloudtrain/live/<instance-id>.json      agent: Beacon (status, log seq, recent lines), rewritten on
                                             each change only: its ETag / md5 says what changed
    _cloudtrain/live/<instance-id>.beat      agent: its unix time, every heartbeat: LastModified is
                                             the heartbeat (a separate object, so beats never look
                                             like changes, whatever the bucket's encryption, and
                                             never rewrite the beacon on a versioned bucket)
    _cloudtrain/live/ended/<instance-id>.json  agent: the final RunStatus, written once, last (its
                                             own folder: a triggerer lists it every couple of
                                             seconds, at the cost of the runs that just ended)
    _cloudtrain/cursors/<triggerer>.json     triggerer: {instance id: next log seq} it has shown

Everything in this module is stdlib only: the agent imports it on the instance (no Airflow there).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_cloudtrain.contract.records import load_known

SPEC_VERSION = 1

# Agent states. The last five are final: the agent writes one of them and then powers off.
# ``idle``: the hung-job watchdog stopped a job whose process tree used no CPU (and no GPU) for
# ``idle_timeout_s``.
STARTING, SETUP, RUNNING = "starting", "setup", "running"
SUCCEEDED, FAILED, INTERRUPTED, TIMED_OUT = "succeeded", "failed", "interrupted", "timed_out"
IDLE = "idle"
FINAL_STATES = frozenset({SUCCEEDED, FAILED, INTERRUPTED, TIMED_OUT, IDLE})

# Tag / label keys carried by every resource we create (instances and volumes).
TAG_RUN_KEY = "cloudtrain-run-key"  # sha of the run key: what adoption looks up
TAG_RUN_URI = "cloudtrain-run-uri"
TAG_RUN = "cloudtrain-run"  # the short run id of the XCom (ct-...)
TAG_DAG_ID = "cloudtrain-dag-id"
TAG_TASK_ID = "cloudtrain-task-id"
TAG_RUN_ID = "cloudtrain-run-id"
TAG_MAP_INDEX = "cloudtrain-map-index"
TAG_TRY = "cloudtrain-try"
TAG_MANAGED = "cloudtrain-managed"
TAG_PRICE = "cloudtrain-price-microusd"  # the hourly price paid, so an adopting retry can report cost


@dataclass(frozen=True)
class RunKey:
    """Identifies one task instance's run across its tries: what adoption and teardown key on."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    scope: str = ""  # the bucket: two deployments of one DAG in one account never share a key

    @classmethod
    def of_task(cls, task: Any, context: Any, scope: str) -> RunKey:
        """The key of the task instance running with ``context`` (``task``: its operator)."""
        map_index = getattr(context["ti"], "map_index", None)
        index = -1 if map_index is None else int(map_index)
        return cls(task.dag_id, task.task_id, context["run_id"], index, scope=scope)

    @property
    def digest(self) -> str:
        raw = json.dumps([self.dag_id, self.task_id, self.run_id, self.map_index, self.scope])
        return hashlib.sha256(raw.encode()).hexdigest()[:20]

    @property
    def short_id(self) -> str:
        """The XCom ``run_id``: short, unique per task instance, safe in names and labels."""
        return f"ct-{self.digest[:12]}"

    def path(self) -> str:
        def safe(text: str) -> str:
            return re.sub(r"[^A-Za-z0-9._=-]+", "_", text)[:120]

        return f"runs/{safe(self.dag_id)}/{safe(self.task_id)}/{safe(self.run_id)}/{self.map_index}"

    def tags(self) -> dict[str, str]:
        return {
            TAG_MANAGED: "true",
            TAG_RUN_KEY: self.digest,
            TAG_RUN: self.short_id,
            TAG_DAG_ID: self.dag_id[:250],
            TAG_TASK_ID: self.task_id[:250],
            TAG_RUN_ID: self.run_id[:250],
            TAG_MAP_INDEX: str(self.map_index),
        }


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts if p)])


def split_uri(uri: str) -> tuple[str, str, str]:
    """``s3://bucket/a/b`` -> ("s3", "bucket", "a/b")."""
    match = re.fullmatch(r"(s3|gs)://([^/]+)/?(.*)", uri)
    if not match:
        raise ValueError(f"{uri!r} is not an s3:// or gs:// URI")
    return match.group(1), match.group(2), match.group(3).strip("/")


# Keys relative to the run folder.
SPEC_KEY = "spec.json"
AGENT_KEY = "agent/airflow_cloudtrain.zip"
CODE_KEY = "code/code.tar.gz"
RESULTS_PREFIX = "results"
CHECKPOINTS_PREFIX = "checkpoints"


def results_prefix(instance_id: str) -> str:
    """Where the agent on ``instance_id`` uploads the job's output (the XCom's ``results_uri``)."""
    return f"{RESULTS_PREFIX}/{instance_id}"


def status_key(instance_id: str) -> str:
    return f"instances/{instance_id}/status.json"


HANDOVER_PREFIX = "handover"
HANDOVER_TIMEOUT_S = 900.0  # an agent waiting for its handover goes on after this long without one


def handover_key(sequence: int) -> str:
    """The marker a make-before-break launch's agent waits for before it restores (``RunSpec.handover_key``):
    written by the operator once the instance it replaces has stopped and synced its last checkpoint."""
    return f"{HANDOVER_PREFIX}/{sequence}.json"


def heartbeat_key(instance_id: str) -> str:
    return f"instances/{instance_id}/heartbeat"


def delivered_key(instance_id: str) -> str:
    """Written by the operator once it has reported this instance's final status to Airflow: a
    retry delivers a final status nobody reported yet, and runs the job again after one it did."""
    return f"instances/{instance_id}/delivered"


def log_key(instance_id: str, seq: int) -> str:
    return f"instances/{instance_id}/logs/{seq:06d}.log"


def log_prefix(instance_id: str) -> str:
    return f"instances/{instance_id}/logs/"


def log_seq(key: str) -> int:
    return int(key.rsplit("/", 1)[-1].split(".")[0])


# -- per-line timestamps in log chunks ---------------------------------------------------------------
# The agent stamps each line with the time its first byte arrived, as ``docker logs -t`` does, so a
# reader shows when the job wrote it, not when a poll happened to read it.
STAMP_LEN = len("2026-11-23T08:00:09.602Z ")
_STAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def format_stamp(at: float) -> bytes:
    """``2026-11-23T08:00:09.602Z `` (UTC, milliseconds, one trailing space)."""
    whole = int(at)
    millis = min(999, int(round((at - whole) * 1000)))
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z ").encode()


def split_stamp(line: str) -> tuple[str | None, str]:
    """``("2026-11-23T08:00:09.602Z", "text")``; ``(None, line)`` for a line without a stamp (a line
    split across chunks by the 4 MiB chunk limit continues unstamped)."""
    if len(line) >= STAMP_LEN and _STAMP.fullmatch(line[:STAMP_LEN].encode("ascii", "replace")):
        return line[: STAMP_LEN - 1], line[STAMP_LEN:]
    return None, line


def strip_stamps(text: str) -> str:
    """The job's output as it printed it: every line without its stamp."""
    return "".join(split_stamp(line)[1] for line in text.splitlines(keepends=True))


# -- the live index -------------------------------------------------------------------------------
LIVE_PREFIX = "_cloudtrain/live"
CURSORS_PREFIX = "_cloudtrain/cursors"
ENDED_FOLDER = "ended"  # end markers: ``ended/<instance-id>.json``
OLD_END_SUFFIX = ".end.json"  # where agents of an earlier version put their end marker
BEACON_SUFFIX = ".json"
BEAT_SUFFIX = ".beat"
TAIL_MAX = 64 * 1024  # bytes of recent log text a beacon carries, so a reader seldom reads chunks


def live_index_uri(bucket_uri: str) -> str:
    """Where the runs of ``bucket_uri`` (the operator's ``bucket``) publish their beacons."""
    return join(bucket_uri, LIVE_PREFIX)


def cursors_uri(bucket_uri_or_live_uri: str) -> str:
    base = bucket_uri_or_live_uri.rstrip("/")
    if base.endswith(LIVE_PREFIX):
        base = base[: -len(LIVE_PREFIX)]
    return join(base, CURSORS_PREFIX)


def beacon_name(instance_id: str) -> str:
    return f"{instance_id}{BEACON_SUFFIX}"


def end_name(instance_id: str) -> str:
    return f"{ENDED_FOLDER}/{instance_id}{BEACON_SUFFIX}"


def beat_name(instance_id: str) -> str:
    return f"{instance_id}{BEAT_SUFFIX}"


BEACON, BEAT, END = "beacon", "beat", "end"


def live_entry(name: str) -> tuple[str, str] | None:
    """``"i-1.json"`` -> ("i-1", BEACON), ``"i-1.beat"`` -> ("i-1", BEAT), ``"ended/i-1.json"``
    (or an earlier agent's ``"i-1.end.json"``) -> ("i-1", END); anything else None."""
    folder, _, base = name.rpartition("/")
    if folder == ENDED_FOLDER and base.endswith(BEACON_SUFFIX):
        return base[: -len(BEACON_SUFFIX)], END
    if folder:
        return None
    for suffix, kind in ((OLD_END_SUFFIX, END), (BEAT_SUFFIX, BEAT), (BEACON_SUFFIX, BEACON)):
        if name.endswith(suffix):
            return name[: -len(suffix)], kind
    return None


@dataclass
class Beacon:
    """One instance's state in the live index: small, and byte-identical while nothing changes.

    ``status`` is the agent's RunStatus without ``updated_at`` (a rewrite without a change keeps the
    same bytes) and without ``checkpoint_history`` (only ``status.json`` carries it); ``log_seq`` the number of log chunks uploaded; ``tail`` the text of chunks
    ``tail_from .. log_seq - 1`` (at most ``TAIL_MAX`` bytes), so a reader that is behind by no more
    than that reads only this object.
    """

    instance_id: str
    status: dict[str, Any]
    log_seq: int = 0
    tail_from: int = 0
    tail: str = ""

    def to_bytes(self) -> bytes:
        status = {k: v for k, v in self.status.items() if k != "updated_at"}
        body = {**asdict(self), "status": status}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Beacon:
        data = json.loads(raw)
        return load_known(cls, data)

    def run_status(self) -> RunStatus:
        return load_known(RunStatus, self.status)

    def lines_from(self, seq: int) -> list[str] | None:
        """The tail's lines from chunk ``seq`` on, or None when ``seq`` is before the tail."""
        if seq < self.tail_from:
            return None
        if seq >= self.log_seq:
            return []
        return _chunk_lines(self.tail, seq - self.tail_from)


def _chunk_lines(tail: str, skip_chunks: int) -> list[str]:
    """The tail joins chunks with a form feed (never in a chunk: the agent drops it) after each."""
    chunks = tail.split("\f")[:-1] if tail else []
    return [line for chunk in chunks[skip_chunks:] for line in chunk.splitlines()]


@dataclass
class RunSpec:
    """What the agent needs to run the job; JSON in ``spec.json``. No credentials in here."""

    run_id: str
    run_uri: str
    cloud: str
    command: str
    setup_cmds: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # {VAR: secret reference} (``agent.secret_refs``): the agent reads each with the instance's own
    # identity and gives the job the value; references only, never a value, are stored here.
    secret_env: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    gpus: int = 0
    code_uri: str | None = None  # tarball (s3:// or gs://) unpacked into the working directory
    max_runtime_s: float | None = None
    volume_device: str | None = None  # an attached volume to mount at volume_mount (EC2: volume_id)
    volume_mount: str = "/mnt/data"
    log_interval_s: float = 2.0
    # The bucket's live index (``live_index_uri``): the agent publishes its Beacon there; None: only
    # the run folder (fleet items, older operators).
    live_uri: str | None = None
    heartbeat_interval_s: float = 5.0
    metadata_poll_s: float = 5.0
    # Checkpoints (see ``airflow_cloudtrain.contract.checkpoint``): the job's checkpoint directory on the
    # instance (None: ``<workdir>/checkpoints``; a relative path is under the workdir), how often the
    # agent uploads the newest complete checkpoint (<= 0: only when the job ends), and how many times
    # the run was relaunched after an interruption (the job sees it as CLOUDTRAIN_RESTARTS).
    checkpoint_dir: str | None = None
    checkpoint_interval_s: float = 300.0
    restarts: int = 0
    # Files of the checkpoint directory that match no framework layout (``checkpoint.pt`` rewritten
    # every epoch, ``state.json``): kept too, each at its newest stable version (True), or left out
    # with a warning (False: only the layouts of ``contract.checkpoint_layouts``).
    checkpoint_snapshots: bool = True
    # On an interruption notice: seconds the job gets between SIGTERM and the final checkpoint sync
    # (None: what the notice leaves, minus the time the sync needs).
    stop_grace_s: float | None = None
    # Hung-job watchdog: stop the job when its process tree used no CPU (and, with GPUs, no GPU) for
    # this long; None: off. The run then ends as ``idle``.
    idle_timeout_s: float | None = None
    # A fleet's spec (``workqueue.WorkerSettings`` as a dict): the agent then runs as a worker that
    # takes items from the queue, each in its own folder ``items/<id>/``; None: one job.
    worker: dict[str, Any] | None = None
    version: int = SPEC_VERSION
    # A gang (``contract.gang``): how many nodes run the job (1: no gang, no barrier); this node's rank
    # (None: the node finds it in ``nodes/ranks.json`` by its instance id); how long a node waits at
    # the barrier for the others before the run fails; the port the head listens on (MASTER_PORT).
    num_nodes: int = 1
    node_rank: int | None = None
    gang_timeout_s: float = 600.0
    master_port: int = 29500
    # A gang's checkpoints (``contract.gang.checkpoint_folder``): "head" (rank 0 uploads its
    # checkpoint_dir to checkpoints/, every rank restores from there) or "all" (rank r uploads to and
    # restores from ``ranks/<r>/checkpoints/``, rank 0 still at checkpoints/). Older specs: "head".
    checkpoint_ranks: str = "head"
    # The run's lease (``contract.lease``): the agent ends the run once ``lease.json`` was not renewed
    # for this long (or, never written, this long after it started). None: no lease (a spec of a
    # release without leases, or ``orphan_timeout=None``): the run depends on ``max_runtime`` alone.
    orphan_timeout_s: float | None = None
    # A make-before-break launch (the resume loop leaving on-demand for spot): the agent restores and
    # starts the job only once this key exists in the run folder (``handover_key``: the instance it
    # replaces has uploaded its last checkpoint), or after ``handover_timeout_s``. None: at once.
    handover_key: str | None = None
    handover_timeout_s: float = HANDOVER_TIMEOUT_S

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        data = json.loads(text)
        return load_known(cls, data)


CHECKPOINT_HISTORY_MAX = 200  # checkpoints a status.json remembers (about 50 bytes each)


@dataclass
class RunStatus:
    """What the agent reports in ``status.json``; ``state`` is one of the constants above."""

    state: str
    instance_id: str
    exit_code: int | None = None
    message: str = ""
    started_at: float | None = None  # unix time the agent started
    job_started_at: float | None = None
    ended_at: float | None = None
    # {"kind": "spot"|"preemption", "notice_at", "action", "at"?} and, as the agent gets there,
    # "job_stopped_at" (the job exited after SIGTERM) and "checkpoint_at" / "checkpoint_step" (the
    # final checkpoint's manifest was written).
    interruption: dict[str, Any] | None = None
    updated_at: float | None = None
    restored_step: int | None = None  # the checkpoint step restored before the job started
    # the restore before the job: {"version", "layout", "step", "source" ("manifest" | "job"),
    # "saved_at"} when a checkpoint was restored; {"note": why not} when a relaunch restored nothing
    restore: dict[str, Any] | None = None
    # the newest checkpoint this agent completed in the run folder:
    # {"step", "saved_at" (the job wrote it), "uploaded_at" (its manifest was written)}
    checkpoint: dict[str, Any] | None = None
    # every checkpoint this agent completed, oldest first, the newest CHECKPOINT_HISTORY_MAX of them:
    # {"at" (its manifest was written), "step", "version"} each (``with_checkpoint``); None from an
    # agent older than the history, or one that uploaded nothing
    checkpoint_history: list[dict[str, Any]] | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def with_checkpoint(self, at: float, step: int | None, version: int | None) -> list[dict[str, Any]]:
        """The history with one more checkpoint, bounded to the newest ``CHECKPOINT_HISTORY_MAX``:
        written with the status change the upload makes anyway, so the timeline can mark every
        checkpoint taken while ``status.json`` stays a few kilobytes."""
        entry = {"at": round(at, 3), "step": step, "version": version}
        return [*(self.checkpoint_history or []), entry][-CHECKPOINT_HISTORY_MAX:]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunStatus:
        data = json.loads(text)
        return load_known(cls, data)


# -- checkpoints in the run folder ------------------------------------------------------------------

MANIFEST_NAME = "MANIFEST.json"


LEFT_OUT_KEY = f"{CHECKPOINTS_PREFIX}/LEFT_OUT.json"


def checkpoint_prefix(version: int) -> str:
    """The folder of one checkpoint version: ``checkpoints/<version>`` (a plain decimal number)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"a checkpoint version is an int >= 0; got {version!r}")
    return f"{CHECKPOINTS_PREFIX}/{version}"


def manifest_key(version: int) -> str:
    """``checkpoints/<version>/MANIFEST.json``: written after every file of the version, so its
    presence means it is complete (and its hashes tell whether the files are the ones it lists)."""
    return f"{checkpoint_prefix(version)}/{MANIFEST_NAME}"


def checkpoint_step(key: str) -> int | None:
    """The version of a key under ``checkpoints/<version>/``, None for any other key (the name is the
    old one: an old release numbered versions by step)."""
    match = re.match(rf"{CHECKPOINTS_PREFIX}/(\d+)/", key)
    return int(match.group(1)) if match else None


checkpoint_version = checkpoint_step


def manifest_versions(keys: list[str]) -> list[int]:
    """The versions that have a manifest among ``keys`` (a listing of ``checkpoints/``), oldest first."""
    return sorted(
        {v for key in keys if (v := checkpoint_version(key)) is not None and key == manifest_key(v)}
    )


@dataclass
class Manifest:
    """``MANIFEST.json`` of a checkpoint version. ``files``: ``{"path", "size", "sha256"}`` each and
    ``"key"`` when the bytes are not at ``checkpoints/<version>/<path>`` (an unchanged file kept from
    an older version); ``path`` is relative to the job's checkpoint directory, e.g. ``ckpt-00042.pt``
    or ``checkpoint-500/model.safetensors``. ``step``: the training step the checkpoint holds as the
    framework says it (name, state file), None for a snapshot of files that carry no step.
    ``layout``: which rules found it (``contract.checkpoint_layouts``: "steps", "tensorflow",
    "lightning", "orbax", "huggingface", "files", joined with "+"). ``units``: the framework
    checkpoints in it, ``{"layout", "step", "name"}`` each."""

    step: int | None
    files: list[dict[str, Any]] = field(default_factory=list)
    created_at: float | None = None  # unix time the agent wrote it
    instance_id: str = ""  # the instance whose agent uploaded it
    saved_at: float | None = None  # when the job wrote it: the newest mtime of its files
    version: int = 1  # the format: 1 = one step per folder, 2 = versions with layouts
    layout: str = "steps"
    units: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a manifest is a JSON object")
        manifest = load_known(cls, data)
        if manifest.step is not None and (
            isinstance(manifest.step, bool) or not isinstance(manifest.step, int)
        ):
            raise ValueError(f"manifest step must be an int or null; got {manifest.step!r}")
        for entry in manifest.files:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("path"), str)
                and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)
                and isinstance(entry.get("key", ""), str)
            ):
                raise ValueError(f"manifest file entries need path, size and sha256; got {entry!r}")
        return manifest
