"""Before a launch: which offers, what goes into the run folder, and what each launch request says.

Pure configuration work over the run folder and the catalog; the create calls themselves happen in
``attempt`` under the ledger.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.lease import DEFAULT_ORPHAN_TIMEOUT_S
from airflow_cloudtrain.contract.runs import (
    AGENT_KEY,
    CODE_KEY,
    SPEC_KEY,
    TAG_PRICE,
    TAG_RUN_URI,
    TAG_TRY,
    RunSpec,
    join,
)

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.core.cloud import LaunchRequest
    from airflow_cloudtrain.core.engine import Log
    from airflow_cloudtrain.spec import RunConfig
    from airflow_cloudtrain.storage import RunFolder

HARD_STOP_MARGIN_MIN_S = 30.0
HARD_STOP_MARGIN_MAX_S = 600.0


@dataclass
class LaunchOptions:
    """Per-cloud launch settings that are not part of the shared vocabulary."""

    image_id: str | None = None
    key_name: str | None = None
    subnet_id: str | None = None
    security_group_ids: list[str] = field(default_factory=list)
    iam_instance_profile: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    volume_id: str | None = None
    service_account: str | None = None
    provisioning: str | None = None
    max_launch_attempts: int = 6
    live_prices: bool = True
    network: str | None = None  # GCE: see operators.network_config
    subnetwork: str | None = None
    external_ip: bool = True
    ssh_source_ranges: list[str] = field(default_factory=list)  # GCE: the run's SSH allow rule
    # Which launch of the run this is (a checkpoint-resume loop relaunches within one try): part of
    # every client token, so a relaunch is a new launch and not the replay of a finished one.
    sequence: int = 0


@dataclass
class JobOptions:
    """What the agent does around the job besides running it (``RunSpec`` fields): checkpoint sync,
    the relaunch count the job sees, the stop grace on a notice and the hung-job watchdog."""

    checkpoint_dir: str | None = None
    checkpoint_interval_s: float = 300.0
    checkpoint_snapshots: bool = True
    restarts: int = 0
    stop_grace_s: float | None = None
    idle_timeout_s: float | None = None
    checkpoint_ranks: str = "head"  # a gang: whose checkpoint_dir is synced ("head" or "all")
    handover_key: str | None = None  # a make-before-break launch: restore once this marker exists


@dataclass
class GangOptions:
    """A gang (``num_nodes`` > 1): its size, placement, whose logs stream, and the barrier's settings
    the agents read from the spec (``contract.gang``)."""

    num_nodes: int
    placement: str | None = None
    log_nodes: str = "all"
    gang_timeout_s: float = 600.0  # every node at the barrier within this long, or the run fails
    master_port: int = 29500  # torchrun's default


@dataclass
class WaitSettings:
    """How a wait polls, and when it stops trusting a silent agent."""

    poll_interval: float = 10.0
    startup_timeout: float | None = None
    heartbeat_timeout: float | None = None
    max_cost_usd: float | None = None  # ``max_cost`` (``core.budget``)
    spent_usd: float = 0.0  # what the run's earlier attempts cost (the resume loop sets it)
    # the run's lease (``core.lease``): the wait renews it, the agent ends the run once it lapsed;
    # None: no lease (``orphan_timeout=None``)
    orphan_timeout: float | None = DEFAULT_ORPHAN_TIMEOUT_S
    # the resume loop's next look at spot while an on-demand attempt runs (unix time; None: never):
    # the wait ends ``probe_due`` then (``core.waiting.RunWatch.probe_at``)
    probe_at: float | None = None


def hard_stop_s(max_runtime_s: float | None) -> int | None:
    """When the cloud itself ends the instance: after ``max_runtime`` plus time for the agent's own
    graceful stop (SIGTERM, results upload, final status), 10% of it within [30 s, 10 min]."""
    if not max_runtime_s:
        return None
    margin = min(HARD_STOP_MARGIN_MAX_S, max(HARD_STOP_MARGIN_MIN_S, 0.1 * max_runtime_s))
    return int(max_runtime_s + margin)


def offers_for(config: RunConfig, region: str | None, log: Log) -> list[Offer]:
    """The ranked offers to launch (cheapest first); an explicit ``instance_type`` is one offer."""
    from airflow_cloudtrain.catalog import rank_offers
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.spec import Hardware

    region = region or config.region
    if config.instance_type:
        # GPUs asked with an explicit type are part of its offer: a GCE N1 type is listed once per
        # accelerator it can take, and the bare (GPU-less) row must not win just for being cheapest.
        asked = Hardware(cpus=1, gpus=config.hardware.gpus, gpu_type=config.hardware.gpu_type)
        known = [
            o
            for o in rank_offers(config.cloud, asked, region=region, zone=config.zone)
            if o.instance_type == config.instance_type
        ]
        if known:
            return known[:1]
        log.warning("instance_type=%r is not in the catalog: no price known", config.instance_type)
        hw = config.hardware
        return [
            Offer(
                config.cloud,
                config.instance_type,
                hw.cpus,
                hw.ram_gib,
                hw.gpus,
                hw.gpu_type,
                region or "",
                (),
                None,
                None,
            )
        ]
    return rank_offers(config.cloud, config.hardware, region=region, zone=config.zone, bid=config.bid)


def write_run_folder(
    config: RunConfig,
    key: RunKey,
    run_uri: str,
    folder: RunFolder,
    volume: bool,
    log: Log,
    job: JobOptions | None = None,
    worker: dict[str, Any] | None = None,
    live_uri: str | None = None,
    secret_env: dict[str, str] | None = None,
    gang: GangOptions | None = None,
    orphan_timeout_s: float | None = None,
) -> None:
    """The spec, the agent and (for a local ``code`` folder) the code tarball, before any launch.

    ``secret_env``: the spec's ``{VAR: cloud secret reference}`` (``lifecycle.run_secrets``).

    ``live_uri``: the bucket's live index, where the agent publishes its beacon for triggers.

    ``gang``: every node's agent reads the gang's size, barrier timeout and port from the spec.

    ``worker`` (``workqueue.WorkerSettings`` as a dict) makes it a fleet's spec: every instance
    launched with it runs items from the queue instead of one job."""
    from airflow_cloudtrain.contract.bootstrap import build_agent_zip

    code_uri = config.code
    if code_uri and not code_uri.startswith(("s3://", "gs://")):
        payload = pack_code(code_uri)
        _write(folder, CODE_KEY, payload)
        log.info("Uploaded code from %s (%d bytes)", code_uri, len(payload))
        code_uri = join(run_uri, CODE_KEY)
    spec = RunSpec(
        run_id=key.short_id,
        run_uri=run_uri,
        cloud=config.cloud,
        command=config.command,
        setup_cmds=config.setup_cmds,
        env=config.env,
        image=config.image,
        gpus=config.hardware.gpus,
        code_uri=code_uri,
        max_runtime_s=config.max_runtime_s,
        volume_device="/dev/sdf" if volume else None,
    )
    if job is not None:
        spec.checkpoint_dir = job.checkpoint_dir
        spec.checkpoint_interval_s = job.checkpoint_interval_s
        spec.checkpoint_snapshots = job.checkpoint_snapshots
        spec.restarts = job.restarts
        spec.stop_grace_s = job.stop_grace_s
        spec.idle_timeout_s = job.idle_timeout_s
        spec.checkpoint_ranks = job.checkpoint_ranks
        spec.handover_key = job.handover_key
    spec.worker = worker
    spec.orphan_timeout_s = orphan_timeout_s  # the agent's lease check (``agent.lease``)
    spec.live_uri = live_uri
    spec.secret_env = dict(secret_env or {})
    if gang is not None:
        spec.num_nodes = gang.num_nodes
        spec.gang_timeout_s = gang.gang_timeout_s
        spec.master_port = gang.master_port
    _write(folder, SPEC_KEY, spec.to_json().encode("utf-8"))
    _write(folder, AGENT_KEY, build_agent_zip())


def _write(folder: RunFolder, key: str, data: bytes) -> None:
    """One object of the run folder, through throttling and server errors (``call_with_retry``). A
    refusal that retrying cannot fix names the object it refused: S3's ``AccessDenied`` (a bucket
    policy, an IAM change) names neither bucket nor key by itself."""
    from airflow_cloudtrain.core.retry import call_with_retry, is_transient

    try:
        call_with_retry(lambda: folder.put_bytes(key, data))
    except Exception as err:
        if is_transient(err):  # the retries' budget is spent: the error says what it is
            raise
        raise RuntimeError(f"Could not write {folder.uri}/{key}: {type(err).__name__}: {err}") from err


def pack_code(path_text: str) -> bytes:
    path = Path(path_text).resolve()  # a symlinked folder is packed as its contents, not as a link
    if not path.is_dir():
        raise ValueError(f"code={path_text!r} is not valid: no such local directory on this worker")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(str(path), arcname=".", filter=_skip_caches)
    return buffer.getvalue()


def _skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    return None if "__pycache__" in parts or ".git" in parts else info


def request_builder(
    config: RunConfig,
    key: RunKey,
    run_uri: str,
    options: LaunchOptions,
    try_number: int,
    worker: bool = False,
) -> Any:
    """``build(offer, zone, attempt) -> LaunchRequest`` for the launcher: same user data and tags,
    a client token per (try, attempt), the bid and the price tag per offer. ``worker``: a fleet's
    worker, whose bootstrap also installs the queue and group SDKs it needs."""
    from airflow_cloudtrain.contract.bootstrap import render_user_data
    from airflow_cloudtrain.core.cloud import LaunchRequest

    stop_s = hard_stop_s(config.max_runtime_s)
    # both clouds get both: EC2 honours the bootstrap's shutdown timer, GCE scheduling.maxRunDuration
    user_data = render_user_data(run_uri, config.cloud, hard_stop_s=stop_s, worker=worker)
    tags = {**options.tags, **key.tags(), TAG_RUN_URI: run_uri, TAG_TRY: str(try_number)}

    def build(offer: Offer, zone: str | None, attempt: int) -> LaunchRequest:
        max_price = config.bid.max_price(offer.price) if config.bid and offer.is_spot else None
        price = {TAG_PRICE: str(round(offer.hourly * 1e6))} if offer.hourly is not None else {}
        return LaunchRequest(
            offer=offer,
            zone=zone,
            user_data=user_data,
            tags={**tags, **price},
            client_token=f"{key.digest}-{try_number}-{attempt + 1000 * options.sequence}"[:64],
            disk_gib=root_disk_gib(config),
            max_price=max_price,
            image_id=options.image_id,
            key_name=options.key_name,
            subnet_id=options.subnet_id,
            security_group_ids=options.security_group_ids,
            iam_instance_profile=options.iam_instance_profile,
            volume_id=options.volume_id,
            service_account=options.service_account,
            provisioning=options.provisioning or ("spot" if offer.is_spot else None),
            hard_stop_s=stop_s,
            network=options.network,
            subnetwork=options.subnetwork,
            external_ip=options.external_ip,
        )

    return build


def price_from_tags(tags: dict[str, str]) -> float | None:
    """The hourly price an earlier try recorded on the instance (micro-USD, label-safe)."""
    try:
        return int(tags[TAG_PRICE]) / 1e6
    except (KeyError, ValueError):
        return None


DEFAULT_DISK_GIB = 50


def root_disk_gib(config: RunConfig) -> int:
    """The root (boot) volume every instance of the run gets: ``hdd``, else 50 GiB."""
    return int(config.hardware.hdd_gib or DEFAULT_DISK_GIB)
