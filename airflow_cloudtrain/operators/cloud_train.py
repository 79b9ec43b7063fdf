"""CloudTrainOperator: one job on one rented instance, and the instance given back whatever happens."""

from __future__ import annotations

import contextlib
import io
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf

from airflow_cloudtrain.operators.config import (
    RunConfig,
    is_templated,
    parse_config,
    parse_duration,
    provider_of,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.runs import RunKey

TEMPLATED = ("cloud", "command", "env", "setup_cmds", "code", "bucket", "cpus", "gpus", "ram", "hdd", "bid",
             "instance_type", "gpu_type", "image", "region", "zone", "max_runtime")  # fmt: skip
STATE_KEY = "cloudtrain_instance"


class CloudTrainOperator(BaseOperator):
    """Run ``command`` on the cheapest instance that meets ``cpus``/``gpus``/``ram``/``hdd``.

    ``cloud`` is ``ec2``, ``ec2spot``, ``gcloud`` or ``gcspot``. The operator writes the run spec to
    the run folder under ``bucket``, launches the instance (failing over to the next offer when a type
    has no capacity), waits for the agent's final status while streaming the job's log, terminates
    the instance, and returns the XCom dict (``run_id``, ``run_uri``, ``instance_type``, ``exit_code``,
    ``duration_s``, ``cost_usd``, ``interruptions``, ...). A retried task adopts the instance an
    earlier try launched instead of launching a second one.
    """

    template_fields: Sequence[str] = TEMPLATED
    template_fields_renderers = {"env": "json", "setup_cmds": "py", "command": "bash"}
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        command: str,
        bucket: str,
        cloud: str = "ec2",
        code: str | None = None,
        image: str | None = None,
        setup_cmds: list[str] | None = None,
        env: dict[str, str] | None = None,
        cpus: int | str = 1,
        gpus: int | str = 0,
        gpu_type: str | None = None,
        ram: int | str | None = None,
        hdd: int | str | None = None,
        instance_type: str | None = None,
        bid: str | float | None = None,
        region: str | None = None,
        zone: str | None = None,
        max_runtime: Any = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        aws_conn_id: str | None = "aws_default",
        gcp_conn_id: str = "google_cloud_default",
        project_id: str | None = None,
        image_id: str | None = None,
        key_name: str | None = None,
        subnet_id: str | None = None,
        security_group_ids: list[str] | None = None,
        iam_instance_profile: str | None = None,
        tags: dict[str, str] | None = None,
        volume_id: str | None = None,
        service_account: str | None = None,
        provisioning: str | None = None,
        max_launch_attempts: int = 6,
        live_prices: bool = True,
        startup_timeout: Any = "30m",
        heartbeat_timeout: Any = "10m",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cloud, self.command, self.bucket, self.code, self.image = cloud, command, bucket, code, image
        self.setup_cmds, self.env = setup_cmds, env
        self.cpus, self.gpus, self.gpu_type, self.ram, self.hdd = cpus, gpus, gpu_type, ram, hdd
        self.instance_type, self.bid, self.region, self.zone = instance_type, bid, region, zone
        self.max_runtime = max_runtime
        self.deferrable = deferrable
        self.poll_interval = float(poll_interval)
        self.aws_conn_id, self.gcp_conn_id, self.project_id = aws_conn_id, gcp_conn_id, project_id
        self.image_id, self.key_name, self.subnet_id = image_id, key_name, subnet_id
        self.security_group_ids = list(security_group_ids or [])
        self.iam_instance_profile, self.tags, self.volume_id = (
            iam_instance_profile,
            dict(tags or {}),
            volume_id,
        )
        self.service_account, self.provisioning = service_account, provisioning
        self.max_launch_attempts = int(max_launch_attempts)
        self.live_prices = live_prices
        # an agent that never reports or stops beating means nobody will power the instance off
        self.startup_timeout = parse_duration(startup_timeout, "startup_timeout")
        self.heartbeat_timeout = parse_duration(heartbeat_timeout, "heartbeat_timeout")
        self._instance_id: str | None = None
        self._backend: Any = None
        self._killed = False
        if provisioning not in (None, "spot", "preemptible"):
            raise ValueError(
                f"provisioning={provisioning!r} is not valid: use 'spot' or 'preemptible' (gcspot only)"
            )
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval={poll_interval!r} is not valid: use a number of seconds > 0")
        self._check_at_parse_time()

    # --- configuration -------------------------------------------------------------------------

    def _args(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TEMPLATED}

    def _check_at_parse_time(self) -> None:
        """Validate what is already known; templated values wait for rendering. Local data only."""
        args = self._args()
        if any(is_templated(v) for v in args.values()):
            return
        config = parse_config(args)
        self._offers(config)  # a request nothing satisfies fails here, naming the largest offers

    def _offers(self, config: RunConfig, region: str | None = None) -> list[Offer]:
        from airflow_cloudtrain.catalog import rank_offers
        from airflow_cloudtrain.catalog.offers import Offer

        region = region or config.region
        if config.instance_type:
            known = [o for o in rank_offers(config.cloud, _minimal(config), region=region, zone=config.zone)
                     if o.instance_type == config.instance_type]  # fmt: skip
            if known:
                return known[:1]
            self.log.warning("instance_type=%r is not in the catalog: no price known", config.instance_type)
            return [Offer(config.cloud, config.instance_type, config.hardware.cpus, config.hardware.ram_gib,
                          config.hardware.gpus, config.hardware.gpu_type, region or "", (), None, None)]  # fmt: skip
        return rank_offers(config.cloud, config.hardware, region=region, zone=config.zone, bid=config.bid)

    # --- execution -----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_cloudtrain.runs import join

        config = parse_config(self._args())
        key = self._run_key(context, config)
        backend = self._get_backend(config)
        stored = _store_get(context.get("task_state_store"), STATE_KEY)
        if stored and stored.get("region"):  # an earlier try launched there: adopt and tear down there
            backend.bind_region(stored["region"])
        elif backend.region is None:  # nothing asked, nothing configured: the cheapest region it is
            backend.bind_region(self._offers(config)[0].region)
        run_uri = join(config.bucket, key.path())
        folder = backend.run_folder(run_uri)
        launch = self._adopt(context, config, backend, key, run_uri)
        if launch is None:
            launch = self._launch(context, config, backend, key, run_uri, folder)
        self._instance_id = launch["instance_id"]
        deadline = time.time() + config.max_runtime_s + 600 if config.max_runtime_s else None
        if self.deferrable:
            from airflow_cloudtrain.triggers.run import RunTrigger

            self.defer(
                trigger=RunTrigger(
                    cloud=config.cloud,
                    instance_id=launch["instance_id"],
                    run_uri=run_uri,
                    poll_interval=self.poll_interval,
                    deadline=deadline,
                    project_id=self.project_id,
                    launch=launch,
                    **backend.trigger_args(launch),
                ),  # fmt: skip
                method_name="execute_complete",
            )
        try:
            event = self._wait_blocking(backend, folder, launch, deadline)
        except Exception:
            self._terminate(backend, launch["instance_id"])
            raise
        return self._finish(backend, event, launch)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the trigger: tear down, account, and raise on anything but success."""
        config = parse_config(self._args())
        backend = self._get_backend(config)
        return self._finish(backend, event, event["launch"])

    def _run_key(self, context: Context, config: RunConfig) -> RunKey:
        from airflow_cloudtrain.runs import RunKey

        map_index = getattr(context["ti"], "map_index", None)
        index = -1 if map_index is None else int(map_index)
        return RunKey(self.dag_id, self.task_id, context["run_id"], index, scope=config.bucket)

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A trigger that crashed or timed out resumes with ``__fail__`` and never reaches
        ``execute_complete``: terminate the instance (from the state store, else by tag) first."""
        if next_method == "__fail__":
            try:
                self._teardown_after_failed_deferral(context)
            except Exception:
                self.log.exception("Teardown after the failed deferral did not complete")
        return super().resume_execution(next_method, next_kwargs, context)

    def _teardown_after_failed_deferral(self, context: Context) -> None:
        config = parse_config(self._args())
        backend = self._get_backend(config)
        stored = _store_get(context.get("task_state_store"), STATE_KEY) or {}
        if stored.get("region"):
            backend.bind_region(stored["region"])
        ids = {i.id for i in backend.cloud.find(self._run_key(context, config).digest)}
        if stored.get("instance_id"):
            ids.add(stored["instance_id"])
        if ids:
            backend.cloud.terminate(sorted(ids))
            self.log.info("Terminated %s after the deferred wait failed", sorted(ids))

    def on_kill(self) -> None:
        """The task was killed while waiting on the worker: take the instance down with it."""
        self._killed = True
        if self._instance_id and self._backend is not None:
            self._terminate(self._backend, self._instance_id)

    def _get_backend(self, config: RunConfig) -> Any:
        if self._backend is None:
            if provider_of(config.cloud) == "aws":
                from airflow_cloudtrain.hooks.aws import AwsRunBackend

                self._backend = AwsRunBackend(self.aws_conn_id, config.region or _zone_region(config))
            else:
                from airflow_cloudtrain.hooks.gcp import GcpRunBackend

                self._backend = GcpRunBackend(
                    self.gcp_conn_id, self.project_id, config.region or _zone_region(config)
                )
        return self._backend

    def _adopt(self, context: Context, config: RunConfig, backend: Any, key: RunKey,
               run_uri: str) -> dict[str, Any] | None:  # fmt: skip
        """Find the instance an earlier try of this task launched (state store first, then tags)."""
        store = context.get("task_state_store")
        stored = _store_get(store, STATE_KEY)
        candidates = []
        if stored and stored.get("run_uri") == run_uri:
            live = backend.cloud.describe([stored["instance_id"]]).get(stored["instance_id"])
            if live is not None and live.state in ("pending", "running"):
                candidates.append(stored)
        if not candidates:
            for inst in backend.cloud.find(key.digest):
                candidates.append({"instance_id": inst.id, "instance_type": inst.instance_type, "zone": inst.zone,
                                   "spot": inst.spot, "launched_at": inst.launch_time or time.time()})  # fmt: skip
        if not candidates:
            return None
        chosen, extra = candidates[0], candidates[1:]
        if extra:
            ids = [c["instance_id"] for c in extra]
            self.log.warning("Terminating %d duplicate instance(s) of this run: %s", len(ids), ids)
            backend.cloud.terminate(ids)
        launch = {**_launch_defaults(run_uri, key, backend, config.cloud), **chosen, "adopted": True}
        self.log.info("Adopting instance %s launched by an earlier try of this task", launch["instance_id"])
        return launch

    def _launch(self, context: Context, config: RunConfig, backend: Any, key: RunKey, run_uri: str,
                folder: Any) -> dict[str, Any]:  # fmt: skip
        from airflow_cloudtrain.agent.bootstrap import build_agent_zip, render_user_data
        from airflow_cloudtrain.clouds.base import LaunchRequest
        from airflow_cloudtrain.launcher import launch_with_failover
        from airflow_cloudtrain.runs import AGENT_KEY, CODE_KEY, SPEC_KEY, TAG_RUN_URI, TAG_TRY, RunSpec, join

        if self.live_prices:
            backend.refresh_catalog()
        offers = self._offers(config, backend.region)
        chosen = offers[0]
        self.log.info("Chosen offer: %s at $%s/h (%s); %d alternatives for failover", chosen.describe(),
                      chosen.hourly, "spot" if chosen.is_spot else "on-demand", len(offers) - 1)  # fmt: skip
        code_uri = self._upload_code(config, folder, join(run_uri, CODE_KEY))
        spec = RunSpec(run_id=key.short_id, run_uri=run_uri, cloud=config.cloud, command=config.command,
                       setup_cmds=config.setup_cmds, env=config.env, image=config.image, gpus=config.hardware.gpus,
                       code_uri=code_uri, max_runtime_s=config.max_runtime_s,
                       volume_device="/dev/sdf" if self.volume_id else None)  # fmt: skip
        folder.put_text(SPEC_KEY, spec.to_json())
        folder.put_bytes(AGENT_KEY, build_agent_zip())
        user_data = render_user_data(run_uri, config.cloud)
        try_number = getattr(context["ti"], "try_number", 1) or 1
        tags = {**self.tags, **key.tags(), TAG_RUN_URI: run_uri, TAG_TRY: str(try_number)}
        disk = config.hardware.hdd_gib or 50

        def build(offer: Offer, zone: str | None, attempt: int) -> LaunchRequest:
            max_price = config.bid.max_price(offer.price) if config.bid and offer.is_spot else None
            return LaunchRequest(offer=offer, zone=zone, user_data=user_data, tags=tags,
                                 client_token=f"{key.digest}-{try_number}-{attempt}"[:64], disk_gib=disk,
                                 max_price=max_price, image_id=self.image_id, key_name=self.key_name,
                                 subnet_id=self.subnet_id, security_group_ids=self.security_group_ids,
                                 iam_instance_profile=self.iam_instance_profile, volume_id=self.volume_id,
                                 service_account=self.service_account,
                                 provisioning=self.provisioning or ("spot" if offer.is_spot else None))  # fmt: skip

        instance, offer, tried = launch_with_failover(
            backend.cloud,
            offers,
            build,
            lambda o: backend.zones_for(config.zone, o),
            self.max_launch_attempts,
            self.log,
        )
        self._instance_id = instance.id
        launch = {
            **_launch_defaults(run_uri, key, backend, config.cloud),
            "instance_id": instance.id,
            "instance_type": offer.instance_type,
            "zone": instance.zone,
            "spot": offer.is_spot,
            "hourly_usd": offer.hourly,
            "launched_at": time.time(),
            "failover": [list(t) for t in tried],
            "adopted": False,
        }
        _store_set(context.get("task_state_store"), STATE_KEY, launch)
        self.log.info("Launched instance %s (%s in %s)", instance.id, offer.instance_type, instance.zone)
        if self.volume_id:
            try:
                device = backend.cloud.attach_volume(instance.id, self.volume_id)
            except Exception:
                self._terminate(backend, instance.id)
                raise
            self.log.info("Attached volume %s as %s", self.volume_id, device)
        return launch

    def _upload_code(self, config: RunConfig, folder: Any, target_uri: str) -> str | None:
        if config.code is None or config.code.startswith(("s3://", "gs://")):
            return config.code
        path = Path(config.code).resolve()  # a symlinked folder is packed as its contents, not as a link
        if not path.is_dir():
            raise ValueError(f"code={config.code!r} is not valid: no such local directory on this worker")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(str(path), arcname=".", filter=_skip_caches)
        from airflow_cloudtrain.runs import CODE_KEY

        folder.put_bytes(CODE_KEY, buffer.getvalue())
        self.log.info("Uploaded code from %s (%d bytes)", path, buffer.tell())
        return target_uri

    def _wait_blocking(
        self, backend: Any, folder: Any, launch: dict[str, Any], deadline: float | None
    ) -> dict[str, Any]:
        from airflow_cloudtrain.logstream import LogFollower
        from airflow_cloudtrain.runs import RunStatus, heartbeat_key, status_key
        from airflow_cloudtrain.waiting import RunWatch, parse_heartbeat

        instance_id = launch["instance_id"]
        follower = LogFollower(instance_id)
        watch = RunWatch(deadline, launch.get("launched_at"), self.startup_timeout, self.heartbeat_timeout)
        while True:
            if self._killed:
                from airflow.exceptions import AirflowException

                raise AirflowException(f"task killed: instance {instance_id} was terminated")
            for line in follower.poll(folder.list, folder.get_bytes):
                self.log.info("[job] %s", line)
            raw = folder.get_text(status_key(instance_id))
            beat = parse_heartbeat(folder.get_text(heartbeat_key(instance_id)))
            instance = backend.cloud.describe([instance_id]).get(instance_id)
            event = watch.decide(RunStatus.from_json(raw) if raw else None, instance, beat)
            if event is not None:
                for line in follower.poll(folder.list, folder.get_bytes):  # what the agent wrote last
                    self.log.info("[job] %s", line)
                return {**event, "instance": instance.to_dict() if instance else None}
            time.sleep(self.poll_interval)

    def _terminate(self, backend: Any, instance_id: str) -> None:
        backend.cloud.terminate([instance_id])
        self.log.info("Terminated instance %s", instance_id)

    def _finish(self, backend: Any, event: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
        """Terminate, account, and raise on anything but success."""
        from airflow_cloudtrain.costs import billed_cost

        if launch.get("region"):  # resumed in a fresh worker: work where the instance was launched
            backend.bind_region(launch["region"])
        self._terminate(backend, launch["instance_id"])
        ended = time.time()
        duration = ended - float(launch.get("launched_at") or ended)
        cost, basis = billed_cost(launch.get("hourly_usd"), duration)
        result = {
            "run_id": launch["run_id"],
            "run_uri": launch["run_uri"],
            "results_uri": launch["run_uri"] + "/results",
            "cloud": launch["cloud"],
            "instance_id": launch["instance_id"],
            "instance_type": launch.get("instance_type"),
            "region": launch.get("region"),
            "zone": launch.get("zone"),
            "spot": bool(launch.get("spot")),
            "exit_code": event.get("exit_code"),
            "state": event.get("state"),
            "duration_s": round(duration, 3),
            "cost_usd": cost,
            "cost_basis": basis,
            "interruptions": int(event.get("interruptions") or 0),
            "adopted": bool(launch.get("adopted")),
            "failover": launch.get("failover", []),
        }
        self.log.info("Run %s ended: %s, exit code %s, %.0f s, cost $%s (%s)", result["run_id"], result["state"],
                      result["exit_code"], duration, cost, basis)  # fmt: skip
        if event.get("status") != "success":
            from airflow.exceptions import AirflowException

            prefix = "spot interruption: " if event.get("interrupted") else ""
            raise AirflowException(
                f"{prefix}{event.get('message') or event.get('state')} (run {result['run_id']})"
            )
        return result


def _skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    return None if "__pycache__" in parts or ".git" in parts else info


def _minimal(config: RunConfig) -> Any:
    from airflow_cloudtrain.spec import Hardware

    return Hardware(cpus=1)


def _zone_region(config: RunConfig) -> str | None:
    if not config.zone:
        return None
    from airflow_cloudtrain.catalog.select import zone_region

    return zone_region(config.cloud, config.zone)


def _launch_defaults(run_uri: str, key: RunKey, backend: Any, cloud: str) -> dict[str, Any]:
    return {"run_uri": run_uri, "run_id": key.short_id, "cloud": cloud, "region": backend.region}


def _store_get(store: Any, key: str) -> dict[str, Any] | None:
    if store is None:
        return None
    try:
        value = store.get(key)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def _store_set(store: Any, key: str, value: dict[str, Any]) -> None:
    if store is not None:
        # crash-safety is best effort: the tag lookup still finds the instance
        with contextlib.suppress(Exception):
            store.set(key, value)
