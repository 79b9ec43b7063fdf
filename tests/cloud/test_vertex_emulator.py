"""The emulated Vertex AI (CustomJobs) and its Cloud Logging entries, driven by the real clients.

Jobs through ``google.cloud.aiplatform_v1.JobServiceClient`` over REST (what the operator uses), logs
through ``POST /v2/entries:list`` with an ``AuthorizedSession`` (google-cloud-logging has no REST
transport). Every replica is a real local process: the tests check what it saw (its environment,
GCS through the emulator) by what it printed, and that it is gone when the job ends.

Every wait is a loop on a condition with a generous deadline (the CI machine has 2 cores).
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import aiplatform_v1 as aip
from google.cloud import storage
from waiting import wait_for

from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.emulator.gcp.vertex import vertex_client_kwargs

PROJECT = "ct-user-project"  # any project: the DAG names its own
LOCATION = "us-central1"
PARENT = f"projects/{PROJECT}/locations/{LOCATION}"
WAIT_S = 60.0
ENDED = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
MANAGED = {"cloudtrain-managed": "true"}  # the session fixture then fails a test that leaks a job

# a replica that says it is up, then runs until stopped
FOREVER = "import time; print('ready', flush=True)\nwhile True: time.sleep(0.2)"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def pool(code: str | None = None, count: int = 1, machine: str = "n1-standard-4", **fields: Any) -> Any:
    """A worker pool running ``python -c code`` (a container spec: run directly, no runtime)."""
    spec: dict[str, Any] = {"replica_count": count, "machine_spec": {"machine_type": machine}}
    if code is not None:
        spec["container_spec"] = {"image_uri": "us-docker.pkg.dev/x/y:1", "command": ["python", "-c", code]}
    spec.update(fields)
    return aip.WorkerPoolSpec(**spec)


class Vertex:
    """The emulator, the clients an operator builds against it, and the jobs a test made."""

    def __init__(self, emu: Any) -> None:
        self.emu, self.server = emu, emu.vertex
        self.client = aip.JobServiceClient(**vertex_client_kwargs(emu.vertex_endpoint))
        self.session = AuthorizedSession(AnonymousCredentials())
        self.made: list[str] = []

    def create(
        self, pools: list[Any], name: str = "", labels: dict[str, str] | None = None, **spec: Any
    ) -> Any:
        job = aip.CustomJob(
            display_name=name or f"ct-{uuid.uuid4().hex[:8]}",
            labels={**MANAGED, **(labels or {})},
            job_spec=aip.CustomJobSpec(worker_pool_specs=pools, **spec),
        )
        created = self.client.create_custom_job(parent=PARENT, custom_job=job)
        self.made.append(created.name)
        return created

    def get(self, name: str) -> Any:
        return self.client.get_custom_job(name=name)

    def wait_state(self, name: str, *states: str, timeout: float = WAIT_S) -> Any:
        def check() -> Any:
            job = self.get(name)
            return job if job.state.name in states else None

        return wait_for(check, timeout=timeout, message=f"{name} in {states}")

    def entries(self, job: Any, extra: str = "", **body: Any) -> list[dict[str, Any]]:
        """Every entry of the job (all pages)."""
        job_id = job.name.rsplit("/", 1)[-1]
        query = f'resource.type="ml_job" AND resource.labels.job_id="{job_id}"' + (
            f" AND {extra}" if extra else ""
        )
        out, token = [], ""
        while True:
            page = self.list_entries(
                {"resourceNames": [f"projects/{PROJECT}"], "filter": query, **body}, token
            )
            out += page.get("entries", [])
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def list_entries(self, body: dict[str, Any], token: str = "") -> dict[str, Any]:
        r = self.session.post(
            f"{self.emu.vertex_endpoint}/v2/entries:list",
            json={**body, **({"pageToken": token} if token else {})},
        )
        assert r.status_code == 200, r.text
        return r.json()

    def lines(self, job: Any, task: str) -> list[str]:
        return [e["textPayload"] for e in self.entries(job, f'resource.labels.task_name="{task}"')]

    def printed(self, job: Any, task: str, text: str) -> bool:
        return any(text in line for line in self.lines(job, task))

    def cleanup(self) -> None:
        for name in self.made:
            job = self.server.job(name)
            if job and job["state"] not in ENDED and job["state"] != "JOB_STATE_CANCELLING":
                self.client.cancel_custom_job(name=name)
        for name in self.made:
            if self.server.job(name):
                self.wait_state(name, *ENDED)


@pytest.fixture
def vx(emu: Any) -> Iterator[Vertex]:
    vertex = Vertex(emu)
    yield vertex
    vertex.cleanup()


def upload_package(files: dict[str, str], name: str = "trainer-0.1") -> str:
    """A .tar.gz sdist (top folder ``name``) uploaded to the emulated bucket; its gs:// URI."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        files = {"setup.py": "from setuptools import setup\nsetup(name='trainer')\n", **files}
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    key = f"vertex-tests/{uuid.uuid4().hex[:8]}/{name}.tar.gz"
    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
    client.bucket(DEFAULT_BUCKET).blob(key).upload_from_string(buf.getvalue())
    return f"gs://{DEFAULT_BUCKET}/{key}"


def package_pool(task_py: str, args: list[str] | None = None, **fields: Any) -> Any:
    uri = upload_package({"trainer/__init__.py": "", "trainer/task.py": task_py})
    spec = aip.PythonPackageSpec(
        executor_image_uri="us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-1:latest",
        package_uris=[uri],
        python_module="trainer.task",
        args=args or [],
    )
    return aip.WorkerPoolSpec(
        replica_count=1,
        machine_spec=aip.MachineSpec(machine_type="n1-standard-4"),
        python_package_spec=spec,
        **fields,
    )


# --- a basic job: lifecycle, resource, logs -----------------------------------------------------

BASIC_TASK = """
import os, sys, time
print("step 1", flush=True)
print("warning: on stderr", file=sys.stderr, flush=True)
for n in range(2, 6):
    print(f"step {n}", flush=True)
print("args", " ".join(sys.argv[1:]), "job", os.environ["CLOUD_ML_JOB_ID"], flush=True)
print("model_dir", os.environ["AIP_MODEL_DIR"], "mine", os.environ["MY_SETTING"], flush=True)
time.sleep(0.5)
"""


def test_basic_job_runs_through_its_states_and_its_lines_come_back_in_order(
    vx: Vertex, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vx.server, "queued_s", 1.5)  # long enough to be seen on a slow machine
    monkeypatch.setattr(vx.server, "pending_s", 1.5)
    out = f"gs://{DEFAULT_BUCKET}/vertex-tests/{uuid.uuid4().hex[:8]}"
    env = [aip.EnvVar(name="MY_SETTING", value="42")]
    task = package_pool(BASIC_TASK, args=["--epochs", "3"])
    task.python_package_spec.env = env
    job = vx.create(
        [task], labels={"team": "ml"}, base_output_directory=aip.GcsDestination(output_uri_prefix=out)
    )
    job_id = job.name.rsplit("/", 1)[-1]
    assert job.name == f"{PARENT}/customJobs/{job_id}" and job_id.isdigit()
    assert job.state.name == "JOB_STATE_QUEUED"

    states = [job.state.name]
    deadline = time.monotonic() + WAIT_S
    while states[-1] not in ENDED and time.monotonic() < deadline:
        state = vx.get(job.name).state.name
        if state != states[-1]:
            states.append(state)
        time.sleep(0.05)
    assert states == ["JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]

    raw = vx.server.job(job.name)
    assert raw["createTime"].endswith("Z") and "." in raw["createTime"]
    assert raw["createTime"] <= raw["startTime"] <= raw["endTime"] <= raw["updateTime"]
    assert raw["labels"] == {**MANAGED, "team": "ml"} and raw["webAccessUris"] == {} and "error" not in raw
    pool0 = raw["jobSpec"]["workerPoolSpecs"][0]
    assert pool0["replicaCount"] == "1" and pool0["diskSpec"] == {
        "bootDiskType": "pd-ssd",
        "bootDiskSizeGb": 100,
    }
    done = vx.get(job.name)
    assert done.start_time and done.end_time and done.job_spec.base_output_directory.output_uri_prefix == out

    entries = vx.entries(job, 'resource.labels.task_name="workerpool0-0"')
    texts = [e["textPayload"] for e in entries]
    # one stream's lines in the order written (stdout and stderr are two pipes: no order between them)
    assert [e["textPayload"] for e in entries if e["severity"] == "INFO"] == [
        "step 1",
        "step 2",
        "step 3",
        "step 4",
        "step 5",
        f"args --epochs 3 job {job_id}",
        f"model_dir {out}/model/ mine 42",
    ]
    assert [e["textPayload"] for e in entries if e["severity"] == "ERROR"] == ["warning: on stderr"]
    stamps = [e["timestamp"] for e in entries]
    assert stamps == sorted(stamps) and raw["startTime"] <= stamps[0] and stamps[-1] <= raw["endTime"]
    first = next(e for e in entries if e["textPayload"] == "step 1")
    assert first["logName"] == f"projects/{PROJECT}/logs/workerpool0-0"
    assert first["resource"] == {
        "type": "ml_job",
        "labels": {"job_id": job_id, "task_name": "workerpool0-0", "project_id": PROJECT},
    }
    assert first["severity"] == "INFO"
    assert len({e["insertId"] for e in entries}) == len(entries)
    service = [e["textPayload"] for e in vx.entries(job, 'resource.labels.task_name="service"')]
    assert service[0] == "Waiting for job to be provisioned." and service[-1] == "Job completed successfully."

    # paging, newest first, a timestamp window, a severity filter
    paged = vx.entries(job, 'resource.labels.task_name="workerpool0-0"', pageSize=3)
    assert [e["insertId"] for e in paged] == [e["insertId"] for e in entries]
    desc = vx.entries(job, 'resource.labels.task_name="workerpool0-0"', orderBy="timestamp desc", pageSize=2)
    assert [e["textPayload"] for e in desc] == texts[::-1]
    later = vx.entries(job, f'resource.labels.task_name="workerpool0-0" AND timestamp>"{stamps[3]}"')
    assert [e["textPayload"] for e in later] == [
        e["textPayload"] for e in entries if e["timestamp"] > stamps[3]
    ]
    errors = vx.entries(job, "severity>=ERROR")
    assert "warning: on stderr" in [e["textPayload"] for e in errors]
    assert all(e["severity"] == "ERROR" for e in errors)


def test_entries_list_refuses_what_it_cannot_read(vx: Vertex) -> None:
    url = f"{vx.emu.vertex_endpoint}/v2/entries:list"
    for body in (
        {"resourceNames": [f"projects/{PROJECT}"], "filter": 'resource.labels.job_id="1" OR severity>=ERROR'},
        {"resourceNames": [f"projects/{PROJECT}"], "filter": 'jsonPayload.x="1"'},
        {"resourceNames": [f"projects/{PROJECT}"], "pageSize": 1001},
        {"resourceNames": [f"projects/{PROJECT}"], "orderBy": "severity"},
        {"filter": 'resource.type="ml_job"'},
    ):
        r = vx.session.post(url, json=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["status"] == "INVALID_ARGUMENT"


# --- a distributed job: TF_CONFIG / CLUSTER_SPEC ----------------------------------------------------

# each replica prints its TF_CONFIG and CLUSTER_SPEC; workers wait for the chief to connect to them on
# their address, the chief connects to every worker then exits 0; the parameter server runs forever
CLUSTER_CODE = """
import json, os, socket, time
tf, spec = json.loads(os.environ["TF_CONFIG"]), json.loads(os.environ["CLUSTER_SPEC"])
print("TF_CONFIG=" + json.dumps(tf), flush=True)
print("CLUSTER_SPEC=" + json.dumps(spec), flush=True)
kind, index = tf["task"]["type"], tf["task"]["index"]
if kind == "worker":
    host, port = tf["cluster"]["worker"][index].split(":")
    server = socket.create_server((host, int(port)))
    server.accept()[0].close()
elif kind == "chief":
    for address in tf["cluster"]["worker"]:
        host, port = address.split(":")
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
else:
    while True:
        time.sleep(0.2)
"""


def test_distributed_job_gives_each_replica_a_consistent_tf_config(vx: Vertex) -> None:
    job = vx.create([pool(CLUSTER_CODE), pool(CLUSTER_CODE, count=2), pool(CLUSTER_CODE)])
    wait_for(lambda: vx.server.replica_processes(job.name).get("workerpool2-0"), message="ps to be running")
    done = vx.wait_state(job.name, *ENDED)
    assert done.state.name == "JOB_STATE_SUCCEEDED", done.error
    tasks = {"workerpool0-0": ("chief", 0), "workerpool1-0": ("worker", 0), "workerpool1-1": ("worker", 1)}
    tasks["workerpool2-0"] = ("ps", 0)
    configs, specs = {}, {}
    for task in tasks:
        lines = wait_for(
            lambda t=task: [x for x in vx.lines(job, t) if "=" in x][:2] or None, message=f"{task}'s config"
        )
        configs[task] = json.loads(next(x for x in lines if x.startswith("TF_CONFIG="))[10:])
        specs[task] = json.loads(next(x for x in lines if x.startswith("CLUSTER_SPEC="))[13:])
    cluster = configs["workerpool0-0"]["cluster"]
    assert set(cluster) == {"chief", "worker", "ps"}
    assert [len(cluster[k]) for k in ("chief", "worker", "ps")] == [1, 2, 1]
    addresses = cluster["chief"] + cluster["worker"] + cluster["ps"]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    for task, (kind, index) in tasks.items():
        pool_index, replica = task.removeprefix("workerpool").split("-")
        assert configs[task]["cluster"] == cluster and configs[task]["task"] == {"type": kind, "index": index}
        assert configs[task]["environment"] == "cloud"
        assert specs[task]["task"] == {"type": f"workerpool{pool_index}", "index": int(replica)}
        assert specs[task]["cluster"] == {
            "workerpool0": cluster["chief"],
            "workerpool1": cluster["worker"],
            "workerpool2": cluster["ps"],
        }
        assert json.loads(specs[task]["job"])["worker_pool_specs"][1]["replica_count"] == "2"
    # the chief is done: the parameter server is stopped, as Vertex stops it
    wait_for(
        lambda: not any(vx.server.replica_processes(job.name).values()), message="every replica to be gone"
    )


def test_a_failing_worker_fails_the_job_with_vertex_message(vx: Vertex) -> None:
    fail = "import sys; print('bad input', file=sys.stderr, flush=True); sys.exit(3)"
    job = vx.create([pool(FOREVER), pool(fail)])
    done = vx.wait_state(job.name, *ENDED)
    assert done.state.name == "JOB_STATE_FAILED"
    assert done.error.code == 3
    assert done.error.message.startswith("The replica workerpool1-0 exited with a non-zero status of 3.")
    assert "bad input" in vx.lines(job, "workerpool1-0")
    wait_for(
        lambda: not any(vx.server.replica_processes(job.name).values()), message="the chief to be stopped"
    )
    assert any("non-zero status of 3" in x for x in vx.lines(job, "service"))


def test_cancel_kills_every_replica_process_and_ends_cancelled(vx: Vertex) -> None:
    job = vx.create([pool(FOREVER), pool(FOREVER, count=2)])
    tasks = ("workerpool0-0", "workerpool1-0", "workerpool1-1")
    for task in tasks:
        wait_for(lambda t=task: vx.printed(job, t, "ready"), message=f"{task} to be up")
    pids = vx.server.replica_processes(job.name)
    assert set(pids) == set(tasks) and all(pids.values())
    tree = [
        p
        for pid in pids.values()
        for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    ]
    assert len(tree) >= 6  # each replica: the machine's launcher and the program it runs
    vx.client.cancel_custom_job(name=job.name)
    assert vx.get(job.name).state.name in ("JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
    done = vx.wait_state(job.name, "JOB_STATE_CANCELLED")
    assert (done.error.code, done.error.message) == (1, "CANCELED")
    assert all(gone(p.pid) for p in tree), [p.pid for p in tree if not gone(p.pid)]
    with pytest.raises(gexc.BadRequest):
        vx.client.cancel_custom_job(name=job.name)  # ended: FAILED_PRECONDITION


def test_list_filters_by_label_and_pages_newest_first(vx: Vertex) -> None:
    batch = uuid.uuid4().hex[:8]
    names = [
        vx.create([pool(FOREVER)], name=f"list-{batch}-{i}", labels={"batch": batch}).name for i in range(5)
    ]
    vx.create([pool(FOREVER)], name=f"other-{batch}", labels={"batch": "other"})
    for name in vx.made:
        vx.client.cancel_custom_job(name=name)
    request = {"parent": PARENT, "filter": f'labels.batch="{batch}"', "page_size": 2}
    pager = vx.client.list_custom_jobs(request=request)
    pages = [[j.name for j in page.custom_jobs] for page in pager.pages]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [n for p in pages for n in p] == names[::-1]
    by_name = vx.client.list_custom_jobs(
        request={"parent": PARENT, "filter": f'display_name="list-{batch}-3"'}
    )
    assert [j.name for j in by_name] == [names[3]]
    for name in vx.made:
        vx.wait_state(name, "JOB_STATE_CANCELLED")
    both = f'labels.batch="{batch}" AND state="JOB_STATE_CANCELLED"'
    assert len(list(vx.client.list_custom_jobs(request={"parent": PARENT, "filter": both}))) == 5
    not_cancelled = f'labels.batch="{batch}" AND state!="JOB_STATE_CANCELLED"'
    assert list(vx.client.list_custom_jobs(request={"parent": PARENT, "filter": not_cancelled})) == []
    elsewhere = "projects/another/locations/europe-west4"
    assert (
        list(vx.client.list_custom_jobs(request={"parent": elsewhere, "filter": f'labels.batch="{batch}"'}))
        == []
    )
    with pytest.raises(gexc.BadRequest):
        list(vx.client.list_custom_jobs(request={"parent": PARENT, "filter": 'labels.a="1" OR labels.b="2"'}))


def test_delete_is_refused_while_running_and_done_once_ended(vx: Vertex) -> None:
    job = vx.create([pool(FOREVER)])
    vx.wait_state(job.name, "JOB_STATE_RUNNING")
    with pytest.raises(gexc.BadRequest, match="cannot be deleted"):
        vx.client.delete_custom_job(name=job.name)
    vx.client.cancel_custom_job(name=job.name)
    vx.wait_state(job.name, "JOB_STATE_CANCELLED")
    op = vx.client.delete_custom_job(name=job.name)
    op.result(timeout=WAIT_S)
    assert op.done() and op.operation.name.startswith(f"{PARENT}/operations/")
    assert op.metadata.generic_metadata.create_time  # DeleteOperationMetadata
    assert vx.client.get_operation({"name": op.operation.name}).done  # polled at /ui/.../operations/OP
    with pytest.raises(gexc.NotFound):
        vx.get(job.name)
    assert vx.server.job(job.name) is None
    assert vx.entries(job)  # the job's logs outlive it, as Cloud Logging's do


# --- validation ---------------------------------------------------------------------------------

CODE = aip.ContainerSpec(image_uri="img")


def _spec(machine: str = "n1-standard-4", accel: str = "", count: int = 0, **fields: Any) -> Any:
    m = aip.MachineSpec(machine_type=machine, accelerator_count=count)
    if accel:
        m.accelerator_type = aip.AcceleratorType[accel]
    return aip.WorkerPoolSpec(**{"replica_count": 1, "machine_spec": m, "container_spec": CODE, **fields})


INVALID = {
    "no display name": ({"display_name": ""}, "display_name"),
    "no worker pools": ({"job_spec": aip.CustomJobSpec()}, "job_spec.worker_pool_specs"),
    "two chiefs": ({"pools": [_spec(replica_count=2)]}, "worker_pool_specs[0].replica_count"),
    "empty first pool": ({"pools": [aip.WorkerPoolSpec(), _spec()]}, "worker_pool_specs[0]"),
    "no code": (
        {
            "pools": [
                aip.WorkerPoolSpec(
                    replica_count=1, machine_spec=aip.MachineSpec(machine_type="n1-standard-4")
                )
            ]
        },
        "worker_pool_specs[0].task",
    ),
    "package without module": (
        {
            "pools": [
                _spec(
                    container_spec=None,
                    python_package_spec=aip.PythonPackageSpec(
                        executor_image_uri="i", package_uris=["gs://b/p"]
                    ),
                )
            ]
        },
        "python_package_spec.python_module",
    ),
    "package without image": (
        {
            "pools": [
                _spec(
                    container_spec=None,
                    python_package_spec=aip.PythonPackageSpec(python_module="m", package_uris=["gs://b/p"]),
                )
            ]
        },
        "python_package_spec.executor_image_uri",
    ),
    "package without uris": (
        {
            "pools": [
                _spec(
                    container_spec=None,
                    python_package_spec=aip.PythonPackageSpec(python_module="m", executor_image_uri="i"),
                )
            ]
        },
        "python_package_spec.package_uris",
    ),
    "unknown machine type": ({"pools": [_spec("n1-standard-3")]}, "machine_spec.machine_type"),
    "unknown accelerator": (
        {"pools": [_spec(accel="NVIDIA_TESLA_K80", count=1)]},
        "machine_spec.accelerator_type",
    ),
    "no gpu on e2": (
        {"pools": [_spec("e2-standard-4", "NVIDIA_TESLA_T4", 1)]},
        "machine_spec.accelerator_type",
    ),
    "a100 on n1": (
        {"pools": [_spec("n1-standard-8", "NVIDIA_TESLA_A100", 1)]},
        "machine_spec.accelerator_type",
    ),
    "a2 gpu count": (
        {"pools": [_spec("a2-highgpu-2g", "NVIDIA_TESLA_A100", 1)]},
        "machine_spec.accelerator_count",
    ),
    "a2 needs its gpu": ({"pools": [_spec("a2-highgpu-1g")]}, "machine_spec.accelerator_type"),
    "bad worker count": ({"pools": [_spec(), _spec(replica_count=0)]}, "worker_pool_specs[1].replica_count"),
    "bad label": ({"labels": {"Team": "ml"}}, "labels"),
    "long label": ({"labels": {"team": "x" * 65}}, "labels"),
    "output not on gcs": (
        {"base_output_directory": aip.GcsDestination(output_uri_prefix="/tmp/out")},
        "base_output_directory.output_uri_prefix",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_create_refuses_an_invalid_job_naming_the_field(vx: Vertex, case: str) -> None:
    change, field = INVALID[case]
    spec = aip.CustomJobSpec(worker_pool_specs=change.get("pools") or [_spec()])
    if "base_output_directory" in change:
        spec.base_output_directory = change["base_output_directory"]
    job = aip.CustomJob(
        display_name=change.get("display_name", "invalid"),
        labels=change.get("labels", {}),
        job_spec=change.get("job_spec", spec),
    )
    with pytest.raises(gexc.BadRequest) as err:
        vx.client.create_custom_job(parent=PARENT, custom_job=job)
    assert field in err.value.message and "List of found errors:" in err.value.message


def test_create_accepts_empty_pools_between_and_checks_raw_json_fields(vx: Vertex) -> None:
    gpu = aip.MachineSpec(
        machine_type="g2-standard-8", accelerator_type=aip.AcceleratorType.NVIDIA_L4, accelerator_count=1
    )
    job = vx.create(
        [pool(FOREVER), aip.WorkerPoolSpec(), pool(FOREVER, machine_spec=gpu)],
        scheduling=aip.Scheduling(
            timeout="86400s", strategy=aip.Scheduling.Strategy.SPOT, restart_job_on_worker_restart=True
        ),
    )
    raw = vx.server.job(job.name)
    pools = raw["jobSpec"]["workerPoolSpecs"]
    assert pools[1] == {} and pools[2]["machineSpec"]["acceleratorType"] == "NVIDIA_L4"
    assert raw["jobSpec"]["scheduling"] == {
        "timeout": "86400s",
        "strategy": "SPOT",
        "restartJobOnWorkerRestart": True,
    }
    vx.client.cancel_custom_job(name=job.name)
    url = f"{vx.emu.vertex_endpoint}/v1/{PARENT}/customJobs"
    body = {
        "displayName": "raw",
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    "replicaCount": "1",
                    "machineSpec": {"machineType": "n1-standard-4"},
                    "containerSpec": {"imageUri": "i"},
                }
            ],
            "scheduling": {"timeout": "soon"},
        },
    }
    r = requests.post(url, json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "job_spec.scheduling.timeout" in r.json()["error"]["message"]
    both = {"containerSpec": {"imageUri": "i"}, "pythonPackageSpec": {"executorImageUri": "i"}}
    body["jobSpec"] = {
        "workerPoolSpecs": [{"replicaCount": "1", "machineSpec": {"machineType": "n1-standard-4"}, **both}]
    }
    r = requests.post(url, json=body, timeout=30)  # a oneof: the client cannot even send both
    assert r.status_code == 400 and "job_spec.worker_pool_specs[0].task" in r.json()["error"]["message"]
    r = requests.get(f"{url}/123", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"


# --- faults -------------------------------------------------------------------------------------


def test_fail_job_fails_a_running_job_and_kills_its_replicas(vx: Vertex) -> None:
    job = vx.create([pool(FOREVER)], name=f"doomed-{uuid.uuid4().hex[:6]}")
    wait_for(lambda: vx.printed(job, "workerpool0-0", "ready"), message="the chief to be up")
    pid = vx.server.replica_processes(job.name)["workerpool0-0"]
    vx.emu.fail_job(job.display_name, "Internal error occurred for the current attempt.")
    done = vx.wait_state(job.name, *ENDED)
    assert done.state.name == "JOB_STATE_FAILED"
    assert done.error.message == "Internal error occurred for the current attempt."
    wait_for(lambda: gone(pid), message="the replica to be killed")


CHECKPOINT_TASK = """
import json, os, time
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
tf = json.loads(os.environ["TF_CONFIG"])
print("address", tf["cluster"]["chief"][0], flush=True)
bucket, _, prefix = os.environ["AIP_CHECKPOINT_DIR"].removeprefix("gs://").partition("/")
client = storage.Client(project=os.environ["GOOGLE_CLOUD_PROJECT"], credentials=AnonymousCredentials())
blob = client.bucket(bucket).blob(prefix + "ckpt.json")
if blob.exists():
    print("resumed from step", json.loads(blob.download_as_text())["step"], flush=True)
else:
    blob.upload_from_string(json.dumps({"step": 7}))
    print("checkpoint written", flush=True)
    while True:
        time.sleep(0.2)
"""


def test_preempt_restarts_a_spot_replica_which_resumes_from_its_checkpoint(vx: Vertex) -> None:
    out = f"gs://{DEFAULT_BUCKET}/vertex-tests/{uuid.uuid4().hex[:8]}"
    job = vx.create(
        [package_pool(CHECKPOINT_TASK)],
        base_output_directory=aip.GcsDestination(output_uri_prefix=out),
        scheduling=aip.Scheduling(strategy=aip.Scheduling.Strategy.SPOT),
    )
    wait_for(lambda: vx.printed(job, "workerpool0-0", "checkpoint written"), message="the first checkpoint")
    first = vx.server.replica_processes(job.name)["workerpool0-0"]
    assert first
    vx.emu.preempt_replica(job.name.rsplit("/", 1)[-1])
    assert vx.get(job.name).state.name == "JOB_STATE_RUNNING"
    done = vx.wait_state(job.name, *ENDED)
    assert done.state.name == "JOB_STATE_SUCCEEDED", done.error
    lines = vx.lines(job, "workerpool0-0")
    assert "resumed from step 7" in lines
    addresses = [x for x in lines if x.startswith("address ")]
    assert len(addresses) == 2 and addresses[0] == addresses[1]  # a fresh process, the same environment
    assert vx.server.replica_restarts(job.name) == {"workerpool0-0": 1}
    assert any("preempted" in x for x in vx.lines(job, "service"))
    wait_for(lambda: gone(first), message="the preempted process to be gone")


def test_preempt_with_restart_job_on_worker_restart_restarts_every_replica(vx: Vertex) -> None:
    job = vx.create(
        [pool(FOREVER), pool(FOREVER)],
        scheduling=aip.Scheduling(strategy=aip.Scheduling.Strategy.SPOT, restart_job_on_worker_restart=True),
    )
    for task in ("workerpool0-0", "workerpool1-0"):
        wait_for(lambda t=task: vx.printed(job, t, "ready"), message=f"{task} to be up")
    before = vx.server.replica_processes(job.name)
    vx.emu.preempt_replica(job.name, "workerpool1-0")
    assert vx.server.replica_restarts(job.name) == {"workerpool0-0": 1, "workerpool1-0": 1}

    def restarted() -> bool:
        now = vx.server.replica_processes(job.name)
        return all(now[t] and now[t] != before[t] for t in before) and all(
            gone(p) for p in before.values() if p
        )

    wait_for(restarted, message="both replicas to run anew")
    for task in before:
        wait_for(lambda t=task: vx.lines(job, t).count("ready") == 2, message=f"{task} up again")
    assert vx.get(job.name).state.name == "JOB_STATE_RUNNING"


def test_preempt_refuses_a_job_not_on_spot(vx: Vertex) -> None:
    job = vx.create([pool(FOREVER)], scheduling=aip.Scheduling(strategy=aip.Scheduling.Strategy.STANDARD))
    with pytest.raises(ValueError, match="spot"):
        vx.emu.preempt_replica(job.name)


def test_a_job_past_its_timeout_fails(vx: Vertex) -> None:
    job = vx.create([pool(FOREVER)], scheduling=aip.Scheduling(timeout="2s"))
    wait_for(lambda: vx.server.replica_processes(job.name).get("workerpool0-0"), message="the chief to be up")
    pid = vx.server.replica_processes(job.name)["workerpool0-0"]
    done = vx.wait_state(job.name, *ENDED)
    assert done.state.name == "JOB_STATE_FAILED" and done.error.code == 4
    assert "timeout" in done.error.message
    wait_for(lambda: gone(pid), message="the replica to be killed")


def test_requests_are_counted_and_throttled(vx: Vertex) -> None:
    vx.emu.reset_counts()
    job = vx.create([pool(FOREVER)])
    vx.get(job.name)
    vx.entries(job)
    vx.emu.throttle(1.0, api="customJobs.get")
    with pytest.raises(gexc.TooManyRequests):
        vx.get(job.name)
    vx.emu.throttle(1.0, api="logging")
    r = vx.session.post(
        f"{vx.emu.vertex_endpoint}/v2/entries:list", json={"resourceNames": [f"projects/{PROJECT}"]}
    )
    assert r.status_code == 429 and r.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    vx.emu.clear_faults()
    counts = vx.emu.request_counts()
    assert counts["customJobs.create"] == 1 and counts["customJobs.get"] == 2
    assert counts["throttled:customJobs.get"] == 1 and counts["entries.list"] == 2
    assert counts["throttled:entries.list"] == 1
