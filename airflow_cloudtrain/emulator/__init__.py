"""Emulated clouds on loopback: the embedded default for tests, the demo, and your own DAGs.

    from airflow_cloudtrain.emulator import Emulator

    with Emulator() as emu:
        emu.aws_endpoint                  # "http://127.0.0.1:PORT" (moto's server)
        emu.gce_endpoint, emu.gcs_endpoint          # Compute Engine v1 REST subset, GCS JSON API
        emu.pubsub_endpoint               # Pub/Sub v1 REST + Monitoring timeSeries.list (one server)
        emu.pubsub                        # the PubSubServer: emu.pubsub.subscription_backlog(name)
        emu.gce                           # the GceServer: emu.gce.alive(), .instance(zone, name, project=None)
        emu.vertex_endpoint               # Vertex AI v1 REST customJobs + Logging entries:list (one server)
        emu.vertex                        # the VertexServer: emu.vertex.job(name), .replica_processes(name)
        emu.secretmanager_endpoint        # Secret Manager v1 REST subset (gcp/secretmanager)
        emu.secretmanager                 # its server: emu.secretmanager.secrets() (those alive now)
        emu.running_instances()           # [{"cloud", "id", "instance_type", "zone", "spot", "group"}]
        emu.interrupt(instance_id, notice_s=5)      # EC2 spot notice / GCE preemption, then reclaimed
        emu.interrupt(instance_id, notice_s=0)      # reclaimed at once, without a notice
        emu.crash_agent(instance_id)                # the agent dies, the machine runs on
        emu.fail_job(job, "message")                # a Vertex AI CustomJob fails (replicas killed)
        emu.preempt_replica(job, "workerpool0-0")   # a SPOT job's replica is reclaimed and restarts
        emu.fail_capacity("g5.xlarge", zone=None)   # InsufficientInstanceCapacity (EC2) or
        emu.fail_capacity("n1-standard-4", zone="us-central1-a")  # ZONE_RESOURCE_POOL_EXHAUSTED (GCE)
        emu.set_spot_price("m5.large", "us-east-1a", 0.2)  # EC2 spot price history moves from now on
        emu.throttle(0.3, api="DescribeInstances")  # 30 % of those calls refused as throttled
        emu.clear_faults()                          # no capacity faults, no throttling
        emu.request_counts()              # {"DescribeInstances": 12, "throttled:DescribeInstances": 4, ...}
        emu.hard_stop_scale = 0.1         # tests: hard stops come after a tenth of their time

Inside the block ``AWS_ENDPOINT_URL``, test credentials, ``STORAGE_EMULATOR_HOST`` and the
``aws_default`` / ``google_cloud_default`` connections point at the emulator, so plain boto3, the
Google clients and DAGs work unchanged; the product code makes exactly the calls it makes in
production.

The instances' side: nothing boots, so for each instance whose EC2 user data / GCE ``startup-script``
is our bootstrap (its ``CT_RUN_URI=`` line, see ``userdata``) the emulator starts the real agent as a
local process (``runner``), with the instance's metadata service (``metadata``) passed the standard
way; the instance ends when the agent powers off, and when an instance ends, every process it ran
(agent, job) is killed. Hard stops are the clouds': EC2 ends the instance ``CT_HARD_STOP_S`` (from the
bootstrap) after launch with ``Client.InstanceInitiatedShutdown``; GCE stops or deletes a VM when its
``scheduling.maxRunDuration`` runs out (``instanceTerminationAction``); alive agent or not.

EC2 Auto Scaling groups (``aws/groups``): moto creates and scales groups, and a member's agent starts
like any instance's (its user data comes from the launch template); the emulator adds what moto
lacks, on the instance poll and around Auto Scaling requests. Members that a ``MixedInstancesPolicy``
puts on the spot market (``OnDemandPercentageAboveBaseCapacity`` below 100, beyond
``OnDemandBaseCapacity``) are spot instances from their launch on, so ``interrupt`` reclaims them as
such; a member terminated from outside (a spot reclaim, its own power-off) is dropped from its group
and replaced up to ``DesiredCapacity``, as AWS's health checks do, while one that leaves through
``TerminateInstanceInAutoScalingGroup`` with a decrement is not; deleting a group terminates every
member, those protected from scale-in too; UpdateAutoScalingGroup keeps the mixed-instances policy
(moto drops it). Members are of the launch template's ``InstanceType``. ``running_instances()``
names a member's group under ``"group"`` (its ``aws:autoscaling:groupName`` tag, or a GCE VM's
``created-by`` managed instance group; None otherwise).

Vertex AI (``gcp/vertex``): CustomJobs of any project and location go QUEUED, PENDING, RUNNING and
end as Vertex's do; while RUNNING every replica (``workerpool{i}-{k}``) is a local process run by the
same runner as the instances' agents (a Python package's module, or a container spec's command, with
Vertex's ``CLUSTER_SPEC``/``TF_CONFIG``/``AIP_*`` environment), so it is killed with its "machine" on
cancel, failure, the end of the job or a preemption; its output lines are the job's Cloud Logging
entries (``entries:list`` on the same server). Replicas are not instances: ``running_instances()``
leaves them out.

Throttling (``throttle(rate, api=None, seed=0)``) refuses that share of the selected requests the
way each cloud does: EC2 HTTP 503 ``RequestLimitExceeded``, S3 503 ``SlowDown``, other AWS services
``Throttling``/``ThrottlingException``, Compute Engine and GCS HTTP 429 ``rateLimitExceeded``, Pub/Sub,
Monitoring, Vertex AI and Logging HTTP 429 ``RESOURCE_EXHAUSTED``. ``api`` is a service (``"ec2"``,
``"s3"``, ``"compute"``, ``"storage"``, ``"pubsub"``, ``"aiplatform"``, ``"logging"``), an operation
(``"DescribeInstances"``, ``"GetObject"``, ``"instances.list"``, ``"objects.get"``,
``"customJobs.get"``, ``"entries.list"``), a list of these, or None for all. Draws come
from a ``random.Random(seed)``. The emulator's own requests are never throttled nor counted.
``fail_writes(prefix_uri, rate, side)`` makes the object writes under a prefix (a run folder) fail
with the store's server error, for the agents, the Airflow side or both, while reads go on.

``request_counts()`` counts requests per operation since start or ``reset_counts()``: EC2 actions,
S3 and other AWS operations, Compute methods, GCS methods, Pub/Sub, Monitoring, Vertex AI and Logging
methods; throttled requests are counted there too, and also under ``"throttled:<operation>"``.

Sessions: each ``Emulator()`` starts from empty accounts on both clouds, also after an earlier one in
the same process (moto's backends are process-wide: they are reset at start, once the previous
session's instance poll has ended; the GCP servers are the Emulator's own). An Emulator started while
another runs in the same process shares that one's AWS account instead (a reset would wipe it under
its feet), with a warning: run one at a time per process for an empty account.

Any account and any project: moto accepts any AWS account, and the GCP servers serve any project id a
request names (Compute Engine and Pub/Sub with state per project, made on first use), so a DAG's own
``project_id`` works. Prices: the AWS Pricing API's ``GetProducts``, EC2 spot price history and zone
offerings (``aws/pricing``) and the Cloud Billing Catalog's SKUs (``gcp/billing``, on the Compute
Engine port, the connection's ``billing_endpoint``) are served from the price snapshot, so a run's live
catalog refresh succeeds and finds the snapshot's prices.

Ports: ``Emulator(ports={"aws": 4750, ...})`` (names in ``PORT_OFFSETS``); unnamed servers take free
ports (the default: tests run side by side). ``cloudtrain emulator`` (``serve_forever``) listens on
``--port`` (4750) plus ``PORT_OFFSETS``, so a restart keeps the endpoints Airflow's processes were
started with; ``--env-file PATH`` writes the exports for them, ``--state-dir`` keeps the work directory and the
clouds' state across a restart (``state``).
It stops on Ctrl-C, SIGTERM or SIGHUP: every instance's agent and job ends, every server closes, and a
temporary work directory is removed.

Layout: ``aws/`` (moto server and middleware, backend helpers, wire formats, prices, AWS instances'
side, Auto Scaling groups),
``gcp/`` (Compute Engine server, its per-project state, rules and catalog; the Billing Catalog; GCS;
Pub/Sub; Vertex AI and its jobs' logs; GCP instances' side), and shared:
``faults`` (throttling), ``userdata`` (reading the bootstrap), ``metadata``, ``runner``, ``serving``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_cloudtrain.emulator import calls
from airflow_cloudtrain.emulator.faults import Throttle
from airflow_cloudtrain.emulator.runner import InstanceRunner, Seen

log = logging.getLogger(__name__)

DEFAULT_BUCKET = "cloudtrain-emulated"
GCP_PROJECT = "cloudtrain-emulated"
AWS_REGIONS = ("us-east-1", "us-west-2", "eu-west-1")
# ``cloudtrain emulator`` listens on BASE + these offsets, so a restart keeps every endpoint (and the
# exports Airflow's processes were started with); the Emulator class takes free ports unless told.
DEFAULT_BASE_PORT = 4750
PORT_OFFSETS = {
    "aws": 0,  # moto: every AWS service, plus the Pricing API
    "gce": 1,  # Compute Engine, plus the Cloud Billing Catalog
    "gcs": 2,
    "pubsub": 3,  # Pub/Sub, plus Cloud Monitoring
    "vertex": 4,  # Vertex AI, plus Cloud Logging
    "metadata": 5,  # the instances' metadata services
    "secretmanager": 6,
}


_SESSION_LOCK = threading.Lock()
_running: list[Emulator] = []  # the Emulators running in this process (moto's backends are process-wide)
_previous: Emulator | None = None  # the last one stopped: its instance poll may still be ending


def _claim_process(emu: Emulator) -> None:
    """Start ``emu`` on an empty AWS account, unless another Emulator runs in this process.

    moto keeps every account in process-wide backends, so a second session would find the queues,
    buckets and groups of the first (the GCP servers are objects of each Emulator and start empty).
    The backends are reset here, as moto's ``/moto-api/reset`` does, after the previous session's
    instance poll has ended (it reads the backends). While another Emulator runs, a reset would wipe
    its account under its feet (a suite's shared Emulator, and a test's own ``with Emulator()``): this
    one then shares that account, and says so."""
    with _SESSION_LOCK:
        others = [e for e in _running if e is not emu]
        if emu not in _running:
            _running.append(emu)
        previous = _previous
    if others:
        log.warning(
            "Another Emulator is running in this process: moto's AWS backends are process-wide, so this "
            "one shares its AWS account (not emptied; the GCP side is its own). For an empty account, "
            "run one Emulator at a time per process."
        )
        return
    poll = getattr(getattr(previous, "runner", None), "_thread", None)
    if poll is not None:
        poll.join(timeout=60)  # stop() waited 10 s; a poll of many instances on a busy machine takes longer
    from moto.moto_api._internal.models import moto_api_backend

    # what moto's POST /moto-api/reset does: every service, every account (a few seconds: each backend's
    # own reset runs, S3's global bucket names and all; dropping the backends alone leaves those behind)
    moto_api_backend.reset()


def _release_process(emu: Emulator) -> None:
    global _previous
    with _SESSION_LOCK:
        if emu in _running:
            _running.remove(emu)
            _previous = emu


def stable_ports(base: int) -> dict[str, int]:
    """Each server's port for base port ``base`` (``PORT_OFFSETS``); base 0: free ports."""
    return {name: base + offset if base else 0 for name, offset in PORT_OFFSETS.items()}


class Emulator:
    """moto server + Compute Engine and GCS emulators + metadata server + a local agent per instance."""

    def __init__(
        self,
        region: str = "us-east-1",
        buckets: tuple[str, ...] = (DEFAULT_BUCKET,),
        workdir: str | Path | None = None,
        hard_stop_scale: float = 1.0,
        ports: dict[str, int] | None = None,
    ) -> None:
        """``ports``: server name (``PORT_OFFSETS``) -> port; a server not named takes a free port.
        ``workdir`` (the instances' logs, the image's home, Vertex AI's files) is kept when given, and
        a temporary one removed on ``stop``."""
        self.region = region
        self.ports = dict(ports or {})
        self.buckets = buckets
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="cloudtrain-emulator-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.aws_endpoint = ""
        self.gce_endpoint = ""
        self.gcs_endpoint = ""
        self.pubsub_endpoint = ""
        self.vertex_endpoint = ""
        self.secretmanager_endpoint = ""  # Secret Manager v1 REST subset (gcp/secretmanager)
        self._hard_stop_scale = hard_stop_scale
        self._throttle = Throttle()
        self._saved_env: dict[str, str | None] = {}
        self._timers: list[threading.Timer] = []
        self._stopped = False

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        import boto3
        from botocore.config import Config

        from airflow_cloudtrain.emulator.aws import EMULATOR_USER_AGENT, MotoServer, seed_public_parameters
        from airflow_cloudtrain.emulator.aws.instances import AwsInstances
        from airflow_cloudtrain.emulator.gcp import GceServer, GcsServer, PubSubServer
        from airflow_cloudtrain.emulator.gcp.instances import GcpInstances
        from airflow_cloudtrain.emulator.gcp.secretmanager import SecretManagerServer
        from airflow_cloudtrain.emulator.gcp.vertex import VertexServer
        from airflow_cloudtrain.emulator.metadata import MetadataServer

        self._stopped = False
        try:
            _claim_process(self)
            self.moto = MotoServer(self._throttle)
            self.aws_endpoint = self._listen("aws", self.moto.start)
            self.gce = GceServer(project=GCP_PROJECT, throttle=self._throttle)
            self.gce.hard_stop_scale = self._hard_stop_scale
            self.gce_endpoint = self._listen("gce", self.gce.start)
            self.gcs = GcsServer(throttle=self._throttle)
            self.gcs_endpoint = self._listen("gcs", self.gcs.start)
            self.pubsub = PubSubServer(project=GCP_PROJECT, throttle=self._throttle)
            self.pubsub_endpoint = self._listen("pubsub", self.pubsub.start)
            # a replica's google.cloud.storage writes to the emulated GCS (its project is the job's)
            replica_env = {"STORAGE_EMULATOR_HOST": calls.instance_url(self.gcs_endpoint)}
            self.vertex = VertexServer(self._throttle, self.workdir / "vertex", replica_env)
            self.vertex_endpoint = self._listen("vertex", lambda port: self.vertex.start(port=port))
            self.secretmanager = SecretManagerServer(GCP_PROJECT, self._throttle)
            self.secretmanager_endpoint = self._listen("secretmanager", self.secretmanager.start)
            self.metadata = MetadataServer()
            self._listen("metadata", self.metadata.start)
        except BaseException:
            self.stop()
            raise
        self._set_env(self.env())
        self._aws = AwsInstances(self.metadata, AWS_REGIONS, self.region)
        self._gcp = GcpInstances(
            self.gce,
            self.metadata,
            calls.instance_url(self.gcs_endpoint),
            # how an emulated VM's agent finds the emulated APIs (unset in production), by the host
            # that tells its calls from the Airflow side's (``calls``)
            extra_env={
                "CLOUDTRAIN_PUBSUB_ENDPOINT": calls.instance_url(self.pubsub_endpoint),
                "CLOUDTRAIN_COMPUTE_ENDPOINT": calls.instance_url(self.gce_endpoint),
                "CLOUDTRAIN_SECRETMANAGER_ENDPOINT": calls.instance_url(self.secretmanager_endpoint),
            },
        )
        from airflow_cloudtrain.contract.botocore_logs import quiet_botocore
        from airflow_cloudtrain.storage import share_service_models

        config = Config(user_agent_extra=EMULATOR_USER_AGENT, retries={"max_attempts": 1})
        with quiet_botocore():  # the emulator's own client: no "Found endpoint ..." lines in the test's log
            session = share_service_models(boto3.session.Session(region_name=self.region))
            s3 = session.client("s3", config=config)
        for bucket in self.buckets:
            s3.create_bucket(Bucket=bucket)
            self.gcs.create_bucket(bucket)
        for region in AWS_REGIONS:
            self._aws.ec2[region].describe_regions()  # makes moto load the region's backends
            seed_public_parameters(region)
        self.runner = InstanceRunner(self._alive, self._powered_off, self.workdir, self._image_env())
        self._gcp.runner = self.runner  # a MIG recreates a VM under its old name: start its agent anew
        self.vertex.runner = self.runner  # Vertex AI replicas run as the instances' agents do
        self.runner.start()

    def _listen(self, name: str, start: Any) -> Any:
        """``start(port)`` for server ``name``; a port taken by another process is a clear error."""
        import socket

        port = self.ports.get(name, 0)
        try:
            if port:  # checked first: werkzeug's servers print their own message and exit instead
                with socket.socket() as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind(("127.0.0.1", port))
            return start(port)
        except (OSError, SystemExit) as err:
            why = err.strerror if isinstance(err, OSError) and err.strerror else "in use"
            raise RuntimeError(
                f"the emulated {name} server cannot listen on 127.0.0.1:{port} ({why}): is another "
                "emulator running? Stop it or choose other ports (cloudtrain emulator --port)"
            ) from err

    def stop(self) -> None:
        self._stopped = True  # a spot notice's timer that fires now reclaims nothing (``_reclaim``)
        for timer in self._timers:
            timer.cancel()
        try:
            for part in ("runner", "metadata", "moto", "gce", "gcs", "pubsub", "vertex", "secretmanager"):
                if hasattr(self, part):
                    getattr(self, part).stop()
            self._restore_env()
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        finally:
            _release_process(self)

    def env(self) -> dict[str, str]:
        """The environment that points AWS clients and Airflow's aws_default at the emulator."""
        conn = {
            "conn_type": "aws",
            "login": calls.AIRFLOW_ACCESS_KEY,  # the Airflow side's calls, told apart (``calls``)
            "password": "testing",
            "extra": {"region_name": self.region, "endpoint_url": self.aws_endpoint},
        }
        gcp = {
            "conn_type": "google_cloud_platform",
            # the Billing Catalog shares the Compute Engine port (gcp/billing: SKUs from the price snapshot)
            "extra": {
                "project": GCP_PROJECT,
                "compute_endpoint": self.gce_endpoint,
                "storage_endpoint": self.gcs_endpoint,
                "billing_endpoint": self.gce_endpoint,
                "pubsub_endpoint": self.pubsub_endpoint,
                "monitoring_endpoint": self.pubsub_endpoint,  # one server serves both APIs
                "vertex_endpoint": self.vertex_endpoint,
                "logging_endpoint": self.vertex_endpoint,  # one server serves both APIs
                "secretmanager_endpoint": self.secretmanager_endpoint,
                "credentials": "anonymous",
            },
        }
        return {
            "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
            "GOOGLE_CLOUD_PROJECT": GCP_PROJECT,
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(gcp),
            "AWS_ENDPOINT_URL": self.aws_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn),
        }

    def _image_env(self) -> dict[str, str]:
        """The emulated machine image: this environment's Python (with boto3 and google-cloud-storage,
        as the clouds' deep-learning images have) is the login shell's python3, set in its profile."""
        home = self.workdir / "image-home"
        home.mkdir(parents=True, exist_ok=True)
        bindir = os.path.dirname(sys.executable)
        (home / ".bash_profile").write_text(f'export PATH="{bindir}:$PATH"\n')
        return {
            **os.environ,
            "HOME": str(home),
            "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
        }

    def _set_env(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()

    # --- what the instances' side sees (aws/instances.py, gcp/instances.py) ----------------------

    def _alive(self) -> list[Seen]:
        instances = self._aws.seen(self._hard_stop_scale) + self._gcp.seen(self._hard_stop_scale)
        return instances + self.vertex.seen()  # and the Vertex AI replicas' machines

    def _powered_off(self, seen: Seen) -> None:
        if seen.cloud == "vertex":  # a replica's process exited (seen.returncode)
            self.vertex.replica_exited(seen)
            return
        (self._gcp if seen.cloud == "gcp" else self._aws).power_off(seen.id)

    def _side(self, instance_id: str) -> Any:
        return self._gcp if self._gcp.knows(instance_id) else self._aws

    # --- the public testing API ----------------------------------------------------------------

    @property
    def hard_stop_scale(self) -> float:
        """Hard stops (EC2 ``CT_HARD_STOP_S``, GCE ``maxRunDuration``) come after their time times this."""
        return self._hard_stop_scale

    @hard_stop_scale.setter
    def hard_stop_scale(self, value: float) -> None:
        self._hard_stop_scale = value
        if hasattr(self, "gce"):
            self.gce.hard_stop_scale = value

    def running_instances(self) -> list[dict[str, Any]]:
        """Every live (pending or running) instance of ours, in every emulated cloud; ``group`` is the
        name of an EC2 Auto Scaling member's group (None for any other instance)."""
        return self._aws.managed() + self._gcp.managed()

    def interrupt(self, instance_id: str, notice_s: float = 5.0) -> None:
        """A spot interruption (EC2) or preemption (GCE): the notice appears in the instance's metadata,
        then, ``notice_s`` later, the cloud takes the instance. ``notice_s=0``: no notice at all, the
        instance is simply gone (the agent dies with it and writes nothing)."""
        if notice_s <= 0:
            self._reclaim(instance_id)
            return
        self._side(instance_id).notice(instance_id, notice_s)
        timer = threading.Timer(notice_s, self._reclaim, args=(instance_id,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _reclaim(self, instance_id: str) -> None:
        if self._stopped:  # the session is over: its instances are gone, the next one's are not its own
            return
        self.runner.kill_agent(instance_id)
        self._side(instance_id).reclaim(instance_id)

    def crash_agent(self, instance_id: str) -> None:
        """The agent dies (killed, out of memory) and the machine keeps running: nobody powers it off."""
        self.runner.kill_agent(instance_id)

    def fail_job(self, job: str, message: str) -> None:
        """A Vertex AI CustomJob (full name, numeric id or display name) fails now with ``message``:
        JOB_STATE_FAILED, its replicas' processes killed."""
        self.vertex.fail_job(job, message)

    def preempt_replica(self, job: str, replica: str = "workerpool0-0") -> None:
        """The spot VM of a running Vertex AI job's replica is reclaimed: the replica's processes are
        killed and it restarts afresh, same environment (every replica does with
        ``restartJobOnWorkerRestart``); the job stays RUNNING. ValueError for a job not on SPOT."""
        self.vertex.preempt_replica(job, replica)

    def fail_capacity(
        self, instance_type: str, zone: str | None = None, after: int = 0, spot_only: bool = False
    ) -> None:
        """From now on launches of this type (in this zone, or anywhere) find no capacity; with
        ``after`` the next that many launches still succeed first (room for only N, e.g. 2 of a gang of 3).
        ``spot_only`` (EC2): only spot launches find none, on-demand ones still get an instance."""
        if spot_only:
            if "." not in instance_type:
                raise ValueError("spot_only capacity faults are emulated for EC2 instance types only")
            with self.moto.middleware.lock:
                self.moto.middleware.spot_capacity_faults.add((instance_type, zone))
            return
        if "." not in instance_type:  # GCE machine types have no dot: n1-standard-4, custom-8-32768
            self.gce.fail_capacity(instance_type, zone, after)
            return
        with self.moto.middleware.lock:
            self.moto.middleware.capacity_faults.add((instance_type, zone))
            self.moto.middleware.capacity_after[(instance_type, zone)] = int(after)

    def set_spot_placement_score(self, zone: str, score: int, instance_type: str | None = None) -> None:
        """From now on EC2's GetSpotPlacementScores gives ``zone`` (a zone name, e.g. us-east-1b)
        ``score`` (1-10) for ``instance_type`` (None: for every type without its own); a zone never
        set scores 5 (``emulator.aws.spot_scores``). Launches are not affected: a score is a forecast."""
        self.moto.middleware.spot_scores.set(zone, score, instance_type)

    def deny_spot_placement_scores(self, denied: bool = True) -> None:
        """GetSpotPlacementScores answers ``UnauthorizedOperation``, as for a role without
        ``ec2:GetSpotPlacementScores`` (or an account EC2 does not give scores to)."""
        self.moto.middleware.spot_scores.denied = denied

    def set_spot_price(self, instance_type: str, zone: str, usd_per_hour: float) -> float:
        """From now on an EC2 spot ``instance_type`` in ``zone`` (a zone name, e.g. us-east-1a) costs
        ``usd_per_hour``: DescribeSpotPriceHistory shows the change from this moment, which it returns."""
        return float(self.moto.middleware.spot_prices.set(instance_type, zone, usd_per_hour))

    def spot_price_changes(self, instance_type: str, zone: str) -> list[tuple[float, float]]:
        """The changes ``set_spot_price`` made for (type, zone): (from unix time, USD/h), in order."""
        return list(self.moto.middleware.spot_prices.of(instance_type, zone))

    def throttle(self, rate: float, api: str | Sequence[str] | None = None, seed: int | None = 0) -> None:
        """From now on refuse ``rate`` (0..1) of the requests ``api`` selects as throttled (module doc);
        ``seed`` restarts the draws (None: go on with the current ones); rate 0 lifts that rule."""
        self._throttle.set(rate, api, seed)

    def unavailable(self, rate: float, api: str | Sequence[str] | None = None, seed: int | None = 0) -> None:
        """From now on answer ``rate`` (0..1) of the requests ``api`` selects with the API's server error
        (EC2 503 ``Unavailable``, S3 500 ``InternalError``, other AWS APIs 500/503, Google APIs 503
        ``backendError``); counted under ``"unavailable:<operation>"``. Selectors and ``seed`` as for
        ``throttle`` (one draw per request serves both); rate 0 lifts that rule."""
        from airflow_cloudtrain.emulator.faults import UNAVAILABLE

        self._throttle.set(rate, api, seed, kind=UNAVAILABLE)

    def fail_writes(
        self,
        prefix_uri: str,
        rate: float = 1.0,
        side: str | None = None,
        seed: int | None = 0,
        kind: str = "unavailable",
    ) -> None:
        """From now on answer ``rate`` (0..1) of the object writes (S3 PutObject and multipart, GCS
        uploads, compose, copy) under ``prefix_uri`` (``s3://bucket/prefix/`` or ``gs://...``: a run
        folder, ending in ``/``) with ``kind``'s error: ``"unavailable"``, the store's server error (S3
        500 ``InternalError``, GCS 503), or ``"denied"``, its access denied (S3 403 ``AccessDenied``, GCS
        403 ``forbidden``: a bucket policy or an IAM change landed); counted as ``<kind>:<operation>``.
        For ``side``: ``"instance"`` (the agents), ``"airflow"`` (the operators and everything else) or
        None (both). Reads, lists and deletes still work; rate 0 lifts the rule (``emulator.faults``)."""
        scheme, _, rest = prefix_uri.partition("://")
        if scheme not in ("s3", "gs") or not rest:
            raise ValueError(
                f"prefix_uri must be s3://bucket/prefix or gs://bucket/prefix; got {prefix_uri!r}"
            )
        self._throttle.fail_writes(rate, "s3" if scheme == "s3" else "storage", rest, side, seed, kind)

    def clear_faults(self) -> None:
        """No capacity faults, no throttling and no server errors any more, in every cloud; no Spot
        placement scores set or denied either."""
        self.gce.clear_faults()
        self._throttle.clear()
        with self.moto.middleware.lock:
            self.moto.middleware.capacity_faults.clear()
            self.moto.middleware.capacity_after.clear()
            self.moto.middleware.spot_capacity_faults.clear()
        self.moto.middleware.spot_scores.clear()

    def request_counts(self) -> dict[str, int]:
        """Requests per operation made by anyone but the emulator itself, since start or reset; those
        refused as throttled are also counted under ``"throttled:<operation>"``."""
        with self.moto.middleware.lock:
            aws = dict(self.moto.middleware.counts)
        return {
            **aws,
            **self.gce.counts(),
            **self.gcs.counts(),
            **self.pubsub.counts(),
            **self.vertex.counts(),
            **self.secretmanager.counts(),
        }

    def reset_counts(self) -> None:
        self.vertex.reset_counts()
        self.secretmanager.reset_counts()
        self.gce.reset_counts()
        self.gcs.reset_counts()
        self.pubsub.reset_counts()
        with self.moto.middleware.lock:
            self.moto.middleware.counts.clear()

    def agent_log(self, instance_id: str) -> str:
        path = self.workdir / "instances" / instance_id / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_until_idle(self, timeout: float = 30.0) -> bool:
        """True once no agent is running (every instance has powered off or been terminated)."""
        return self.runner.wait_idle(timeout)


def serve_forever(
    base_port: int = DEFAULT_BASE_PORT,
    workdir: str | Path | None = None,
    env_file: str | Path | None = None,
    check_every_s: float = 2.0,
) -> int:
    """``cloudtrain emulator``: serve on ``base_port`` + ``PORT_OFFSETS`` (0: free ports) until Ctrl-C,
    SIGTERM or SIGHUP; print (and write to ``env_file``) the exports that point Airflow at it, and a
    timestamped line whenever the set of running instances changes.

    Stopping ends every instance's agent and job, and every server; a temporary work directory is
    removed (``workdir``, when given, is kept).
    """
    import signal

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()  # a second Ctrl-C while stopping changes nothing: the stop is already under way

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        if workdir is not None:
            Path(workdir).mkdir(parents=True, exist_ok=True)
        saved = _saved_state(workdir)
        try:
            emu = Emulator(workdir=workdir, ports=stable_ports(base_port))
            emu.start()
        except RuntimeError as err:
            print(f"cloudtrain emulator: {err}", file=sys.stderr, flush=True)
            return 1
        from airflow_cloudtrain.emulator.state import restore

        kept = restore(emu, saved)
        try:
            exports = export_lines(emu.env())
            if env_file is not None:
                write_env_file(Path(env_file), exports)
            print("Emulated clouds are up. In every shell that runs an Airflow process:", flush=True)
            if env_file is not None:
                print(f"  source {env_file}", flush=True)
            else:
                print("\n".join(exports), flush=True)
            print(f"Bucket: s3://{DEFAULT_BUCKET} and gs://{DEFAULT_BUCKET}", flush=True)
            print(f"Work directory: {emu.workdir}   (Ctrl-C or SIGTERM to stop)", flush=True)
            if kept:
                print(f"Restored the clouds' state from {workdir}: {', '.join(kept)}", flush=True)
            shown: list[str] | None = None
            while not stop.wait(check_every_s):
                now = sorted(_describe(i) for i in emu.running_instances())
                if now != shown:
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    print(f"[{stamp}] running: {', '.join(now) if now else 'no instance'}", flush=True)
                    shown = now
        finally:
            print("Stopping: ending every instance and server...", flush=True)
            _stop_keeping_state(emu, workdir)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _saved_state(workdir: str | Path | None) -> dict[str, Any] | None:
    """With a state directory, the clouds as the last stop left them (``state``), read before the
    emulator starts."""
    if workdir is None:
        return None
    from airflow_cloudtrain.emulator.state import load

    return load(Path(workdir))


def _stop_keeping_state(emu: Emulator, workdir: str | Path | None) -> None:
    """Stop; with a state directory, save the clouds' state there first (``state``)."""
    if workdir is None:
        emu.stop()
        return
    from airflow_cloudtrain.emulator.state import save_and_stop

    save_and_stop(emu, Path(workdir))


def _describe(inst: dict[str, Any]) -> str:
    """``i-0abc (aws g4dn.xlarge us-east-1a spot)`` for the periodic running line."""
    extra = " spot" if inst.get("spot") else ""
    group = f" group {inst['group']}" if inst.get("group") else ""
    return f"{inst['id']} ({inst['cloud']} {inst['instance_type']} {inst['zone']}{extra}{group})"


def export_lines(env: dict[str, str]) -> list[str]:
    """``export KEY=VALUE`` lines, quoted for any POSIX shell (the connections are JSON)."""
    import shlex

    return [f"export {key}={shlex.quote(value)}" for key, value in env.items()]


def write_env_file(path: Path, exports: list[str]) -> None:
    """Write the exports at once (a reader never sees half a file): ``source PATH`` in Airflow's shells."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    header = "# cloudtrain emulator: source this file in every shell that runs an Airflow process\n"
    tmp.write_text(header + "\n".join(exports) + "\n")
    tmp.replace(path)


__all__ = [
    "DEFAULT_BASE_PORT",
    "DEFAULT_BUCKET",
    "PORT_OFFSETS",
    "Emulator",
    "export_lines",
    "serve_forever",
    "stable_ports",
    "write_env_file",
]
