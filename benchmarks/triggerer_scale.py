"""Waiting at scale: N deferred waits in one triggerer's event loop, ours beside the Amazon provider's.

Three kinds of process, so that only the triggers are measured: the emulator (``Emulator()``, plus a
loopback endpoint of this script's that serves its ``request_counts()``), the simulated agents, and
a fresh process per (implementation, N) running the N triggers in ONE asyncio loop as Airflow's
``TriggerRunner`` does: each trigger built from its kwargs in ``create_triggers``' loop, run in its own
task (``greenback.ensure_portal()``, then ``async for event in trigger.run()``), the first event
recorded; every task cancelled at the end (a triggerer shutdown: no ``on_kill``).

The agents: N instances made without our bootstrap (so the emulator starts no agent process) and one
simulated agent each, in their own process (a thread pool with boto3 / google-cloud-storage clients
whose user agent carries ``cloudtrain-emulator``, so the emulator does not count them). Each writes
what the agent writes (``runs``): ``status.json``, log chunks of stamped lines, its ``Beacon`` in the
bucket's live index after each chunk, its ``.beat`` there on each heartbeat; at its end the last
chunk, the final status, the final beacon, the end marker, then its instance ends. Rates (flags): a
job prints a line every ``--line-s`` (1.5 s; ``--quiet-share``, 20 %, one a minute), the agent uploads
a chunk every ``--flush-s`` (10 s; the real agent 2 s) when there are lines and beats every
``--beat-s`` (15 s; real 5 s), both stretched alike where N agents would write more than
``--max-writes`` (150) objects a second; starts staggered over one flush. Slower than the real agent
so that the emulator keeps up on 2 cores (a 10 s poll sees a change in every chatty run either way
up to N=1,000). With the run trigger, ``--end-share`` (20 %) of the runs end during the measurement,
and each trigger starts a chunk or two behind its run (its task deferred a moment ago).

Measured per (implementation, N), over ``--cycles`` windows of one poll interval (10 s). A polling
task is a shared poll group's task, or, for ``EC2StateSensorTrigger``, each trigger's own; its poll
rounds are its requests (worker threads count for the task that started them) up to an idle second.
  first poll  from the first trigger built until every polling task finished its first round
  cycle wall  a round's time beyond its task's sleep (next round's start - this one's - the sleep)
  per cycle   totals over the steady windows (all but the first) divided by their number (our
              triggers' groups poll at a fixed rate: a window is a cycle; for the Amazon trigger,
              whose triggers poll one after another, by the rounds they began): requests by API (from the emulator's counts), SDK clients created
              (botocore ``Session.create_client``, aiobotocore ``AioSession.create_client``, google
              storage/compute clients), process CPU seconds (all its threads)
  clients     also in all, and those not closed once the triggers were cancelled
  loop lag    how late a 50 ms ticker in the same loop fires, p50/p99/max from the start on; when the
              loop misses ticks by > 100 ms a thread notes where the loop's thread is, or, if it only
              waits (for the GIL), the busy threads (notes under the tables)
  memory      RSS growth from before the triggers to the end of the last window, per trigger
  job end     run trigger: its event's time minus the time the agent wrote the final status
  gc          garbage collections that stopped the process for more than 50 ms: how many, the
              longest, and the CPU time of that one (the rest: the process waited for a core)
Job log lines go to a structlog processor that counts and drops them (a triggerer writes files).

    python benchmarks/triggerer_scale.py [--sizes 100 1000 3000] [--clouds aws gcp] [--cycles 4]
"""

from __future__ import annotations

import argparse
import atexit
import contextvars
import functools
import gc
import heapq
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airflow_cloudtrain.emulator.aws.images import an_image

if "AIRFLOW_HOME" not in os.environ:  # a home of its own, removed at the end
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="cloudtrain-bench-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)
AMAZON = "airflow.providers.amazon.aws.triggers.ec2.EC2StateSensorTrigger"
OURS_INSTANCE = "airflow_cloudtrain.triggers.instances.InstanceStateTrigger"
OURS_RUN = "airflow_cloudtrain.triggers.run.RunTrigger"
IMPLS = {
    "aws": [("ours: InstanceStateTrigger", OURS_INSTANCE), ("EC2StateSensorTrigger", AMAZON)],
    "gcp": [("ours: InstanceStateTrigger", OURS_INSTANCE)],
}
IMPLS["aws"].append(("ours: RunTrigger", OURS_RUN))
IMPLS["gcp"].append(("ours: RunTrigger", OURS_RUN))
PROJECT, REGION, ZONES = (
    "cloudtrain-emulated",
    "us-east-1",
    ["us-central1-a", "us-central1-b", "us-central1-c"],
)
OWN_UA = "cloudtrain-emulator"  # emulator.faults.EMULATOR_USER_AGENT: neither counted nor throttled
FRAMES = ("airflow_cloudtrain", "providers/amazon", "greenback")  # shown in the loop-blocked notes
NAN = float("nan")
GAP_S = 0.45  # a polling task idle this long has finished its round (the end poll rests >= 0.5 s)
BUCKET = "cloudtrain-emulated"  # the emulator's DEFAULT_BUCKET, on S3 and on GCS


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else NAN


def child(role: str) -> subprocess.Popen[str]:
    """This script in another role, talking JSON lines over its stdin/stdout."""
    cmd = [sys.executable, __file__, "--role", role]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def ask(proc: subprocess.Popen[str], message: dict[str, Any] | None = None) -> Any:
    """Send ``message`` (if any), return the next JSON line the child prints (other lines skipped)."""
    if message is not None:
        proc.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
    while not (line := proc.stdout.readline()).startswith("{"):  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the {proc.args[-1]} process ended")
    return json.loads(line)


def read_message() -> Any:
    return json.loads(sys.stdin.readline())


# --- the emulator's process ----------------------------------------------------------------------
def serve_emulator() -> None:
    """The emulator; its counts live in this process, so a loopback GET hands them to the others."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from airflow_cloudtrain.emulator import Emulator

    with Emulator() as emu:

        class Counts(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(emu.request_counts()).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Counts)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(json.dumps({"env": emu.env(), "counts": f"http://127.0.0.1:{server.server_port}"}), flush=True)
        sys.stdin.read()  # until the orchestrator closes our stdin
        server.shutdown()


def emulator_counts() -> Counter[str]:
    with urllib.request.urlopen(os.environ["CT_BENCH_COUNTS"], timeout=30) as resp:
        return Counter(json.loads(resp.read()))


# --- the simulated agents' process ---------------------------------------------------------------
@dataclass
class SimRun:
    iid: str
    folder: str  # the run folder's key prefix in the bucket
    live: str  # the live index's key prefix
    line_s: float
    started: float
    next_flush: float
    next_line: float
    seq: int = 0
    lines: int = 0
    last_beat: float = 0.0
    end_at: float | None = None
    ended: float | None = None  # when it wrote its final status
    token: int = 0  # the heap entry that is current (older ones are skipped)
    tail: deque[str] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)


class AgentSim:
    """N agents' writes on a schedule: one heap of due times, a thread pool, one action per run at once."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from airflow_cloudtrain.contract import runs

        self.spec, self.side, self.n, self.r = spec, spec["side"], spec["n"], runs
        self.pool = ThreadPoolExecutor(spec["threads"])
        self.heap: list[tuple[float, int, int]] = []
        self.cv = threading.Condition()
        self.local = threading.local()
        self.puts, self.errors, self.lags, self.to_end = 0, 0, deque(maxlen=20000), []
        self.put_times: deque[float] = deque(maxlen=20000)
        if self.side == "aws":
            import boto3
            from botocore.config import Config

            cfg = Config(user_agent_extra=OWN_UA, max_pool_connections=32, retries={"max_attempts": 5})
            self.s3, self.ec2 = (boto3.client(s, region_name=REGION, config=cfg) for s in ("s3", "ec2"))

    def put(self, key: str, data: bytes) -> None:
        """One object write: S3 PutObject, or a GCS upload (a client per thread)."""
        started = time.monotonic()
        if self.side == "aws":
            self.s3.put_object(Bucket=self.spec["bucket"], Key=key, Body=data)
        else:
            if not hasattr(self.local, "bucket"):
                from google.api_core.client_info import ClientInfo
                from google.auth.credentials import AnonymousCredentials
                from google.cloud import storage

                info, anonymous = ClientInfo(user_agent=OWN_UA), AnonymousCredentials()
                client = storage.Client(project=PROJECT, credentials=anonymous, client_info=info)
                self.local.bucket = client.bucket(self.spec["bucket"])
            self.local.bucket.blob(key).upload_from_string(data)
        self.puts += 1
        self.put_times.append(time.monotonic() - started)

    def create_instances(self) -> list[str]:
        """N instances without our bootstrap in their user data: no agent process is started."""
        if self.side == "aws":
            image = an_image(self.ec2)
            ids: list[str] = []
            while len(ids) < self.n:
                k = min(500, self.n - len(ids))
                got = self.ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=k, MaxCount=k)
                ids += [i["InstanceId"] for i in got["Instances"]]
            return ids
        from google.api_core.gapic_v1.client_info import ClientInfo
        from google.cloud import compute_v1

        from airflow_cloudtrain.emulator.gcp import compute_client_kwargs

        kwargs = compute_client_kwargs(self.spec["gce"])
        self.gce = compute_v1.InstancesClient(**kwargs, client_info=ClientInfo(user_agent=OWN_UA))
        zone, image = self.spec["zone"], "projects/debian-cloud/global/images/family/debian-12"

        def insert(name: str) -> str:
            body = compute_v1.Instance(
                name=name,
                machine_type=f"zones/{zone}/machineTypes/n1-standard-2",
                disks=[{"boot": True, "auto_delete": True, "initialize_params": {"source_image": image}}],
                network_interfaces=[{"network": "global/networks/default"}],
            )
            self.gce.insert(project=PROJECT, zone=zone, instance_resource=body).result(timeout=60)
            return name

        return list(self.pool.map(insert, [f"scale-{self.n}-{i:05d}" for i in range(self.n)]))

    def start(self) -> dict[str, Any]:
        rng, spec, ids = random.Random(self.n), self.spec, self.create_instances()
        now, live = time.time(), f"{spec['prefix']}/{self.r.LIVE_PREFIX}"
        self.runs = [
            SimRun(iid, f"{spec['prefix']}/runs/{i:05d}", live, spec["line_s"], now, now, now)
            for i, iid in enumerate(ids)
        ]
        list(self.pool.map(self.first_writes, self.runs))
        now = time.time()  # the jobs start printing now, their agents' flushes staggered over one interval
        for r in self.runs:
            r.line_s = 60.0 if rng.random() < spec["quiet_share"] else spec["line_s"]
            r.next_flush, r.next_line = now + rng.uniform(0, spec["flush_s"]), now + rng.uniform(0, 2)
        with self.cv:
            self.heap = [(r.next_flush, i, 0) for i, r in enumerate(self.runs)]
            heapq.heapify(self.heap)
        threading.Thread(target=self.schedule, daemon=True).start()
        threading.Thread(target=self.end_instances, daemon=True).start()
        return {"runs": [[r.iid, r.folder] for r in self.runs]}

    def status(self, r: SimRun, state: str, at: float) -> dict[str, Any]:
        end, code = (None, None) if state == "running" else (at, 0)
        return asdict(self.r.RunStatus(state, r.iid, code, "", r.started, r.started, end, updated_at=at))

    def beacon(self, r: SimRun, status: dict[str, Any]) -> None:
        body = self.r.Beacon(r.iid, status, r.seq, r.seq - len(r.tail), "".join(r.tail)).to_bytes()
        self.put(f"{r.live}/{self.r.beacon_name(r.iid)}", body)

    def beat(self, r: SimRun) -> None:
        r.last_beat = time.time()
        self.put(f"{r.live}/{self.r.beat_name(r.iid)}", str(r.last_beat).encode())

    def first_writes(self, r: SimRun) -> None:
        status = self.status(r, "running", r.started)
        self.put(f"{r.folder}/{self.r.status_key(r.iid)}", json.dumps(status).encode())
        self.beacon(r, status)
        self.beat(r)

    def chunk(self, r: SimRun, upto: float, last: str | None = None) -> bool:
        """Upload the lines the job printed up to ``upto`` as the next chunk; False when there were none."""
        lines = []
        while r.next_line <= upto:
            text = f"step {r.lines + len(lines)} loss=0.{r.seq:04d} lr=3e-4 tokens/s=48211\n"
            lines.append(self.r.format_stamp(r.next_line) + text.encode())
            r.next_line += r.line_s
        if last:
            lines.append(self.r.format_stamp(upto) + last.encode())
        if not lines:
            return False
        data = b"".join(lines)
        self.put(f"{r.folder}/{self.r.log_key(r.iid, r.seq)}", data)
        r.seq, r.lines = r.seq + 1, r.lines + len(lines)
        r.tail.append(data.decode() + "\f")  # the beacon's tail: chunks, each with a form feed after it
        while sum(len(t) for t in r.tail) > self.r.TAIL_MAX:
            r.tail.popleft()
        return True

    def act(self, i: int, due: float) -> None:
        """What is due for run ``i`` (a chunk and its beacon, a heartbeat, or the end), then its next time."""
        r, now, nxt, spec = self.runs[i], time.time(), None, self.spec
        self.lags.append(now - due)
        try:
            with r.lock:
                if r.end_at is not None and now >= r.end_at and r.ended is None:
                    t_final = time.time()
                    self.chunk(r, t_final, "training done\n")
                    final = self.status(r, "succeeded", t_final)
                    self.put(f"{r.folder}/{self.r.status_key(r.iid)}", json.dumps(final).encode())
                    self.beacon(r, final)
                    end_marker = self.r.RunStatus(**final).to_json().encode()
                    self.put(f"{r.live}/{self.r.end_name(r.iid)}", end_marker)
                    r.ended = t_final
                    with self.cv:
                        self.to_end.append(r.iid)
                elif r.ended is None:
                    if now >= r.next_flush:
                        if self.chunk(r, now):
                            self.beacon(r, self.status(r, "running", now))
                        r.next_flush += spec["flush_s"]
                    if now - r.last_beat >= spec["beat_s"]:
                        self.beat(r)
                    nxt = min(r.next_flush, r.last_beat + spec["beat_s"], r.end_at or float("inf"))
        except Exception:
            self.errors += 1
            nxt = now + 1.0
        if nxt is not None:
            with self.cv:
                heapq.heappush(self.heap, (nxt, i, r.token))
                self.cv.notify()

    def schedule(self) -> None:
        while True:
            with self.cv:
                while not self.heap or self.heap[0][0] > time.time():
                    self.cv.wait(max(0.0, self.heap[0][0] - time.time()) if self.heap else 1.0)
                due, i, token = heapq.heappop(self.heap)
                if token != self.runs[i].token:
                    continue  # superseded by a later entry for this run
                self.runs[i].token += 1
            self.pool.submit(self.act, i, due)

    def end_at(self, plan: dict[str, float]) -> None:
        index = {r.iid: i for i, r in enumerate(self.runs)}
        with self.cv:
            for iid, at in plan.items():
                r = self.runs[index[iid]]
                r.end_at = at
                heapq.heappush(self.heap, (at, index[iid], r.token))
            self.cv.notify()

    def end_instances(self) -> None:
        """An agent powers off after its end marker: EC2 terminates it (shutdown behaviour), GCE stops."""
        while True:
            time.sleep(2.0)
            with self.cv:
                batch, self.to_end = self.to_end, []
            try:
                if batch and self.side == "aws":
                    self.ec2.terminate_instances(InstanceIds=batch)
                for name in batch if self.side == "gcp" else []:
                    self.gce.stop(project=PROJECT, zone=self.spec["zone"], instance=name)
            except Exception:
                self.errors += 1

    def report(self) -> dict[str, Any]:
        """Since the last report: writes, how late they were, how long they took."""
        lags, puts, self.lags, self.put_times = list(self.lags), list(self.put_times), deque(), deque()
        return {
            "ended": {r.iid: [r.ended, r.seq] for r in self.runs if r.ended},
            "seqs": {r.iid: r.seq for r in self.runs},
            "puts": self.puts,
            "errors": self.errors,
            "lag_p99": pct(lags, 0.99),
            "put_p99": pct(puts, 0.99),
            "put_max": max(puts, default=0.0),
            "writes": len(puts),
        }


def simulate() -> None:
    sim = AgentSim(read_message())
    print(json.dumps(sim.start()), flush=True)
    for line in sys.stdin:
        if (msg := json.loads(line))["op"] == "end":
            sim.end_at(msg["plan"])
        print(json.dumps(sim.report()), flush=True)


# --- the measured process --------------------------------------------------------------------------
class Probe:
    """Instrumentation only (behaviour unchanged): HTTP requests' times, SDK clients made and closed,
    log events counted (and dropped)."""

    def __init__(self) -> None:
        self.requests: list[list[float]] = []  # [actor, start, end (nan while in flight)]
        self.clients: Counter[str] = Counter()
        self.open: dict[int, str] = {}
        self.logged: Counter[str] = Counter()

    def install(self, side: str) -> None:
        import logging

        import aiobotocore.client
        import aiobotocore.session
        import botocore.client
        import botocore.session
        import structlog
        import urllib3.connectionpool

        def wrap(cls: Any, name: str, before: Any = None, after: Any = None, is_async: bool = False) -> None:
            """``before(obj)`` may return a request entry, whose end is set when the call returns;
            ``after(obj, result, args, kwargs)`` sees the result and returns what the call returns."""
            orig = getattr(cls, name)

            def sync(obj: Any, *args: Any, **kwargs: Any) -> Any:
                entry = before(obj) if before else None
                token = IN_CALL.set(True) if entry is not None else None
                try:
                    result = orig(obj, *args, **kwargs)
                    return after(obj, result, args, kwargs) if after else result
                finally:
                    if entry is not None:
                        IN_CALL.reset(token)  # type: ignore[arg-type]
                        entry[2] = time.monotonic()

            async def aio(obj: Any, *args: Any, **kwargs: Any) -> Any:
                entry = before(obj) if before else None
                token = IN_CALL.set(True) if entry is not None else None
                try:
                    result = await orig(obj, *args, **kwargs)
                    return after(obj, result, args, kwargs) if after else result
                finally:
                    if entry is not None:
                        IN_CALL.reset(token)  # type: ignore[arg-type]
                        entry[2] = time.monotonic()

            setattr(cls, name, functools.wraps(orig)(aio if is_async else sync))

        def request(obj: Any) -> list[float] | None:
            if IN_CALL.get():
                return None  # the HTTP request of an SDK call already counted
            actor = poller(ACTOR.get())  # a thread without a task's context: by thread
            entry = [actor if actor >= 0 else -threading.get_ident(), time.monotonic(), NAN]
            self.requests.append(entry)
            return entry

        def made(kind: str) -> Any:
            def after(obj: Any, result: Any, args: Any, kwargs: Any) -> Any:
                client = result if result is not None else obj  # create_client, or a google __init__
                service = args[0] if args else kwargs.get("service_name", "")
                region = kwargs.get("region_name") or (args[1] if len(args) > 1 else "")
                what = f"{kind} {service} {region or ''}".strip() if service else kind
                self.clients[what] += 1
                self.open[id(getattr(client, "_transport", client))] = what  # compute: its transport closes
                return result

            return after

        def closed(obj: Any) -> None:
            self.open.pop(id(obj), None)

        # a request lasts from the SDK call to its parsed answer (botocore, aiobotocore), or, for the
        # google clients, over HTTP (urllib3, under requests)
        wrap(botocore.client.BaseClient, "_make_api_call", before=request)
        wrap(aiobotocore.client.AioBaseClient, "_make_api_call", before=request, is_async=True)
        wrap(urllib3.connectionpool.HTTPConnectionPool, "urlopen", before=request)
        wrap(botocore.session.Session, "create_client", after=made("botocore"))
        # AioSession.create_client returns a context whose coroutine is _create_client: the client
        wrap(aiobotocore.session.AioSession, "_create_client", after=made("aiobotocore"), is_async=True)
        wrap(botocore.client.BaseClient, "close", before=closed)
        for name in ("close", "__aexit__"):
            wrap(aiobotocore.client.AioBaseClient, name, before=closed, is_async=True)
        if side == "gcp":  # not on EC2's rows: 180,000 objects a triggerer there does not hold
            from google.cloud import compute_v1, storage

            for cls in (storage.Client, compute_v1.InstancesClient, compute_v1.ZoneOperationsClient):
                wrap(cls, "__init__", after=made(f"google {cls.__name__}"))
            wrap(storage.Client, "close", before=closed)
            for cls in (compute_v1.InstancesClient, compute_v1.ZoneOperationsClient):
                wrap(cls.get_transport_class("rest"), "close", before=closed)

        def count_and_drop(logger: Any, method: str, event: dict[str, Any]) -> Any:
            text = str(event.get("event", ""))
            if method in ("warning", "error", "exception", "critical"):  # shown (the first few), counted
                text = f"{method}: {text % event.get('positional_args', ()) if '%' in text else text}"
                if sum(k.startswith(method) for k in self.logged) < 5 and text[:60] not in self.logged:
                    print(f"trigger {text}", file=sys.stderr)
            self.logged[text[:60] if text.startswith(method) else text.split(" ")[0][:20]] += 1
            raise structlog.DropEvent

        filtering = structlog.make_filtering_bound_logger(logging.INFO)
        structlog.configure(processors=[count_and_drop], wrapper_class=filtering)
        logging.disable(logging.INFO)  # warnings still reach stderr


ACTOR: contextvars.ContextVar[int] = contextvars.ContextVar("actor", default=-1)
IN_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("in_call", default=False)
_actors = itertools.count()


TASKS: dict[int, tuple[int, str]] = {}  # actor -> (the actor that created it, its coroutine's name)


def actor_tasks(loop: Any, coro: Any, context: Any = None) -> Any:
    """Task factory: each task gets an ACTOR id, which worker threads inherit (``to_thread`` copies
    the context), and who made it is noted, so that a request can be put down to the polling task
    behind it (``poller``)."""
    import asyncio

    ctx = (context or contextvars.copy_context()).copy()
    actor = next(_actors)
    TASKS[actor] = (ctx.get(ACTOR, -1), getattr(coro, "__qualname__", ""))
    ctx.run(ACTOR.set, actor)
    return asyncio.Task(coro, loop=loop, context=ctx)


def poller(actor: int) -> int:
    """The task a request is for: its shared poll group's loop, else the trigger's own task (the
    helper tasks in between, ``wait_for``, ``ensure_future``, count as theirs)."""
    while actor in TASKS and TASKS[actor][0] != -1 and not TASKS[actor][1].endswith("_Group.loop"):
        actor = TASKS[actor][0]
    return actor


def poll_rounds(requests: list[list[float]], gap: float, end: float) -> dict[float, list[list[float]]]:
    """Per polling task, its poll rounds: its requests in bursts split at idle gaps of at least
    ``gap``; a round with a request still in flight at ``end`` ends at nan."""
    per: dict[float, list[list[float]]] = {}
    for actor, t0, t1 in sorted((r for r in requests if r[1] <= end), key=lambda r: r[1]):
        t1, rounds = (t1 if t1 <= end else NAN), per.setdefault(actor, [])
        if rounds and (rounds[-1][1] != rounds[-1][1] or t0 - rounds[-1][1] < gap):
            rounds[-1][1] = NAN if t1 != t1 else max(rounds[-1][1], t1)
        else:
            rounds.append([t0, t1])
    return per


IDLE = ("select", "wait", "_worker", "sleep", "readline", "read", "readinto", "recv_into", "accept")
OWN = ("blocked_stacks", "watchdog", "sampler")  # this script's threads


def blocked_stacks(ticks: list[float], found: Counter[str], main: int, ending: threading.Event) -> None:
    """While the loop is late on its 50 ms ticker by > 100 ms, note where the loop's thread is; when it
    is only waiting (in its select, or for the GIL), where the other busy threads are."""

    def where(frame: Any) -> str:
        stack = traceback.extract_stack(frame)[-40:]
        ours = [
            f"{Path(f.filename).name}:{f.lineno} {f.name}"
            for f in stack
            if any(p in f.filename for p in FRAMES)
        ]
        lib = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.name}" for f in stack[-2:]]
        return " < ".join(ours[-2:][::-1] + lib[::-1])

    while not ending.wait(0.05):  # until the ticker is cancelled with the triggers
        if ticks and time.monotonic() - ticks[-1] > 0.15:
            frames = sys._current_frames()
            if frames.get(main) is not None and frames[main].f_code.co_name not in IDLE:
                found["loop: " + where(frames[main])] += 1
                continue
            me = threading.get_ident()
            for frame in [
                f for i, f in frames.items() if i not in (main, me) and f.f_code.co_name not in IDLE + OWN
            ][:2]:
                found["thread: " + where(frame)] += 1


def measure(spec: dict[str, Any]) -> None:
    """N triggers in one loop for ``cycles`` poll intervals, sampled at each interval's end."""
    import asyncio
    import importlib

    import greenback
    import psutil

    module, _, name = spec["classpath"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    probe = Probe()
    probe.install(spec["side"])
    interval, proc = spec["interval"], psutil.Process()
    samples: list[dict[str, Any]] = []
    ticks: list[float] = []
    lags: list[float] = []
    events: dict[int, tuple[float, Any]] = {}
    stacks: Counter[str] = Counter()
    pauses: list[tuple[float, float]] = []  # (wall, CPU) seconds of collections over 50 ms
    gc_started = [0.0, 0.0]

    def gc_timer(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[:] = time.perf_counter(), time.thread_time()
        elif (took := time.perf_counter() - gc_started[0]) > 0.05:
            pauses.append((took, time.thread_time() - gc_started[1]))

    gc.callbacks.append(gc_timer)

    def sample() -> None:
        counts, clients = emulator_counts(), sum(probe.clients.values())
        rss, cpu = proc.memory_info().rss, time.process_time()
        samples.append({"t": time.monotonic(), "cpu": cpu, "counts": counts, "clients": clients, "rss": rss,
                        "lags": len(lags), "events": len(events), "leases": lease_writes(),
                        "own": len(probe.requests)})  # fmt: skip

    async def run_trigger(i: int, trigger: Any) -> None:  # as TriggerRunner.run_trigger
        await greenback.ensure_portal()
        async for event in trigger.run():
            events.setdefault(i, (time.time(), event.payload))

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + 0.05
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            lags.append(loop.time() - due)
            ticks.append(time.monotonic())
            due = max(due + 0.05, loop.time() + 0.01)

    def sampler() -> None:
        """Samples at each interval's end, on time however busy the loop is."""
        for k in range(1, spec["cycles"] + 1):
            time.sleep(max(0.0, samples[0]["t"] + k * interval - time.monotonic()))
            sample()

    async def main() -> None:
        asyncio.get_running_loop().set_task_factory(actor_tasks)
        gc.collect()
        tracked[0] = len(gc.get_objects())  # what a full collection walks before the triggers
        sample()  # the baseline, before the ticker runs: it blocks the loop a moment
        t0 = samples[0]["t"]
        sampling = threading.Thread(target=sampler, daemon=True)
        sampling.start()
        threading.Thread(target=watchdog, daemon=True).start()
        tasks = [asyncio.create_task(ticker(), name="ticker")]
        print(json.dumps({"t0": time.time()}), flush=True)
        for i, kwargs in enumerate(spec["kwargs"]):  # as TriggerRunner.create_triggers
            await asyncio.sleep(0)
            trigger = cls(**kwargs)
            await asyncio.sleep(0)
            tasks.append(asyncio.create_task(run_trigger(i, trigger), name=f"trigger {i}"))
        built[0] = time.monotonic() - t0
        tracked[1:] = [len(gc.get_objects()), gc.get_freeze_count()]  # walked / frozen (triggers.heap)
        while sampling.is_alive():  # (not to_thread: the executor's queue may be long)
            await asyncio.sleep(0.2)
        waited = set(spec["expect"])  # the runs that end: a little longer for their events
        while time.monotonic() < t0 + (spec["cycles"] + 2) * interval and not waited <= set(events):
            await asyncio.sleep(0.2)
        ending.set()
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=30)
        await asyncio.sleep(1.0)  # closing what the cancelled tasks left
        emit(closed=True)  # not asyncio.run's end: it waits for every job queued in the executor

    def watchdog() -> None:
        """A loop too busy to get to its end within a minute of the last window: report without it."""
        deadline = samples[0]["t"] + (spec["cycles"] + 2) * interval + 60
        while time.monotonic() < deadline:
            time.sleep(1.0)
        emit(closed=False)

    def emit(closed: bool) -> None:
        with emitting:
            result = summarize(spec, probe, samples, lags, events, stacks, built[0], closed)
            longest = max(pauses, default=(0.0, 0.0))
            result["gc_pauses"] = [len(pauses), *longest]
            result["gc_tracked"] = tracked
            print(json.dumps(result), flush=True)
            os._exit(0)

    built, emitting, ending, tracked = [NAN], threading.Lock(), threading.Event(), [0, 0, 0]
    threading.Thread(
        target=blocked_stacks, args=(ticks, stacks, threading.get_ident(), ending), daemon=True
    ).start()
    asyncio.run(main())


def lease_writes() -> int:
    """The run triggers' lease renewals so far in this process (``triggers.leases``): one PUT per run
    per renew interval, batched per bucket, beside the index's other writes."""
    if "airflow_cloudtrain.triggers.run" not in sys.modules:
        return 0
    from airflow_cloudtrain.triggers.run import INDEXES

    return sum(index.leases.writes for index in list(INDEXES._items.values()))


def summarize(spec: dict[str, Any], probe: Probe, samples: list[dict[str, Any]], lags: list[float],
              events: dict[int, Any], stacks: Counter[str], built: float, closed: bool) -> dict[str, Any]:  # fmt: skip
    """The row's numbers from what ``measure`` gathered (see the module doc)."""
    interval, n = spec["interval"], len(spec["kwargs"])
    t0, end = samples[0]["t"], samples[-1]["t"]
    amazon = spec["classpath"] == AMAZON  # every trigger polls for itself
    per = poll_rounds(list(probe.requests), GAP_S, end)
    pollers = {a: r for a, r in per.items() if len(r) > 2 or (amazon and a >= 0)}  # not one-off reads
    sleeps = {
        a: min((b[0] - x[1] for x, b in itertools.pairwise(r)), default=interval) for a, r in pollers.items()
    }
    walls = [b[0] - x[0] - sleeps[a] for a, r in pollers.items() for x, b in itertools.pairwise(r)]
    firsts = [r[0][1] for r in pollers.values()] + [NAN] * (n - len(pollers) if amazon else 0)
    steady = samples[1]["t"] if len(samples) > 2 else t0
    paced = [r for a, r in pollers.items() if amazon or sleeps[a] >= 0.8 * interval]  # each poll_interval
    cycles = sum(steady <= x[0] < end for r in paced for x in r) / max(1, n if amazon else len(paced))
    windows = []
    for a, b in itertools.pairwise(samples):
        lag = lags[a["lags"] : b["lags"]]
        windows.append({"requests": dict(b["counts"] - a["counts"]), "cpu": b["cpu"] - a["cpu"],
                        "clients": b["clients"] - a["clients"], "events": b["events"] - a["events"],
                        "leases": b.get("leases", 0) - a.get("leases", 0),
                        "own": b.get("own", 0) - a.get("own", 0),  # this process's requests (--triggerers)
                        "lag": [pct(lag, 0.5), pct(lag, 0.99), max(lag, default=0.0)]})  # fmt: skip
    return {
        "n": n,
        "built_s": built,
        "first_poll_s": max(firsts, default=NAN) - t0 if all(f == f for f in firsts) else NAN,
        "walls": walls,
        "cycles": cycles,
        "window_s": end - t0,
        "windows": windows,
        "lag": [pct(lags, 0.5), pct(lags, 0.99), max(lags, default=0.0)],
        "rss_kb": (samples[-1]["rss"] - samples[0]["rss"]) / 1024 / n,
        "clients": dict(probe.clients),
        "open_clients": dict(Counter(list(probe.open.values()))) if closed else None,
        "events": {
            i: [t, {k: v for k, v in p.items() if k != "launch"}] for i, (t, p) in list(events.items())
        },
        "logged": dict(probe.logged),
        "stacks": stacks.most_common(3),
    }


# --- the orchestrator ------------------------------------------------------------------------------
def agent_rates(args: argparse.Namespace, n: int) -> dict[str, float]:
    """Flush and heartbeat intervals for N agents, both stretched alike when the writes would pass
    ``--max-writes`` per second (a chunk + its beacon per flush, a minute for quiet jobs; a beat)."""
    q = args.quiet_share
    writes = n * ((1 - q) * 2 / args.flush_s + q * 2 / max(60, args.flush_s) + 1 / args.beat_s)
    stretch = max(1.0, writes / args.max_writes)
    return {"flush_s": args.flush_s * stretch, "beat_s": args.beat_s * stretch, "writes_s": writes / stretch}


def trigger_kwargs(classpath: str, runs_: list[list[str]], spec: dict[str, Any], seqs: dict[str, int]) -> Any:
    """The kwargs the triggerer would deserialize for each of the N deferred tasks."""
    from airflow_cloudtrain.contract import runs
    from airflow_cloudtrain.core.records import LaunchRecord

    aws, rng = spec["side"] == "aws", random.Random(7)
    conn = "aws_default" if aws else "google_cloud_default"
    cloud, where, project = ("ec2", REGION, None) if aws else ("gcloud", spec["zone"], PROJECT)
    bucket = f"{'s3' if aws else 'gs'}://{spec['bucket']}"
    out = []
    for i, (iid, folder) in enumerate(runs_):
        if classpath == AMAZON:
            out.append({"instance_id": iid, "target_state": "terminated", "aws_conn_id": conn,
                        "region_name": REGION, "poll_interval": int(spec["interval"])})  # fmt: skip
        elif classpath == OURS_INSTANCE:  # "terminated": never reached while we measure
            out.append({"cloud": cloud, "instance_ids": [iid], "target_state": "terminated", "conn_id": conn,
                        "region": where, "poll_interval": spec["interval"], "project_id": project})  # fmt: skip
        else:
            launch = LaunchRecord(f"ct-bench-{i:05d}", f"{bucket}/{folder}", cloud, REGION if aws else "us-central1",
                                  iid, launched_at=time.time() - 60, location=where,
                                  live_uri=runs.live_index_uri(f"{bucket}/{spec['prefix']}"))  # fmt: skip
            behind = rng.randint(0, 2)  # deferred a moment ago: a chunk or two not shown yet
            out.append({"launch": launch.to_dict(), "conn_id": conn, "project_id": project,
                        "poll_interval": spec["interval"], "deadline": None, "startup_timeout": None,
                        "heartbeat_timeout": None, "next_log_seq": max(0, seqs[iid] - behind),
                        "orphan_timeout": 1800.0})  # fmt: skip  # the default: a lease per run per 5 min
    return out


def run_config(label: str, classpath: str, sim: Any, runs_: list[list[str]], spec: dict[str, Any]) -> Any:
    """Fresh triggerer processes for (implementation, N): one, or with ``--triggerers K`` K at once, each
    running every K-th of the N triggers (as Airflow spreads deferred tasks over its triggerers); with
    the run trigger, some runs end in them. One result per process."""
    kwargs = trigger_kwargs(classpath, runs_, spec, ask(sim, {"op": "report"})["seqs"])
    rng = random.Random(len(runs_))
    ending = (
        sorted(rng.sample(range(len(runs_)), int(spec["end_share"] * len(runs_))))
        if classpath == OURS_RUN
        else []
    )
    k = max(1, int(spec.get("triggerers", 1)))
    shares = [list(range(j, len(runs_), k)) for j in range(k)]
    procs = [child("measure") for _ in shares]
    for proc, share in zip(procs, shares, strict=True):  # all asked first: the processes start together
        local = {g: i for i, g in enumerate(share)}
        message = {**spec, "classpath": classpath, "kwargs": [kwargs[g] for g in share]}
        proc.stdin.write(json.dumps({**message, "expect": [local[g] for g in ending if g in local]}) + "\n")  # type: ignore[union-attr]
    t0s = [ask(proc)["t0"] for proc in procs]
    if ending:  # between 5 s in and one interval before the last window's end
        last = (spec["cycles"] - 1) * spec["interval"]
        ask(sim, {"op": "end", "plan": {runs_[i][0]: min(t0s) + rng.uniform(5.0, last) for i in ending}})
    results = [ask(proc) for proc in procs]
    for proc in procs:
        proc.wait()
    report = ask(sim, {"op": "report"})
    for j, (res, share) in enumerate(zip(results, shares, strict=True)):
        res["label"] = label if k == 1 else f"{label} [triggerer {j + 1} of {k}]"
        res["triggerers"] = k
        res["sim"] = dict(report)
        mine = [g for g in ending if g in set(share)]
        if mine:
            local = {g: i for i, g in enumerate(share)}
            ended = report["ended"]
            got = {int(i): v for i, v in res["events"].items()}
            late = [
                got[local[g]][0] - ended[runs_[g][0]][0]
                for g in mine
                if local[g] in got and runs_[g][0] in ended
            ]
            wrote = sum(runs_[g][0] in ended for g in mine)  # a busy machine may leave the agents late
            res["job_end"] = [pct(late, 0.5), pct(late, 0.95), len(late), wrote, len(mine)]
            res["log_complete"] = sum(
                got[local[g]][1].get("next_log_seq") == ended[runs_[g][0]][1] for g in mine if local[g] in got
            )
            res["outcomes"] = dict(
                Counter(
                    str(got[local[g]][1].get("outcome", {}).get("state")) for g in mine if local[g] in got
                )
            )
        res["sim"].pop("ended", None)
        res["sim"].pop("seqs", None)
        res.pop("events")
    return results


def fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def fmt_requests(counts: dict[str, float]) -> str:
    shown = sorted(((k, v) for k, v in counts.items() if v >= 0.05), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {fmt(v)}" for k, v in shown) or "0"


def steady(res: dict[str, Any], key: str) -> Any:
    """Per poll cycle over the windows after the first (which holds the start): per window (one
    poll interval); for the Amazon trigger, totals divided by the poll rounds its triggers began in
    them (their mean), as each polls again only after its round."""
    wins = res["windows"][1:] or res["windows"]
    cycles = (res["cycles"] or len(wins)) if res["label"] == "EC2StateSensorTrigger" else len(wins)
    if key != "requests":
        return sum(w[key] for w in wins) / cycles
    total: Counter[str] = Counter()
    for w in wins:
        total.update(w["requests"])
    return {k: v / cycles for k, v in total.items()}


def print_tables(side: str, results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    title = "EC2 + S3" if side == "aws" else "GCE + GCS"
    rates = {r["n"]: agent_rates(args, r["n"]) for r in results}
    per_n = "; ".join(
        f"N={n}: {r['flush_s']:.3g} s / {r['beat_s']:.3g} s ({r['writes_s']:.0f} writes/s)"
        for n, r in rates.items()
    )
    print(f"\n### {title}: poll interval {args.interval:g} s, {args.cycles} windows per row. Agents: a line every "
          f"{args.line_s:g} s ({args.quiet_share:.0%} of the jobs: one a minute), a chunk / a heartbeat every {per_n}; "
          f"{args.end_share:.0%} of the runs end during the run trigger's rows\n")  # fmt: skip
    print("| implementation | N | first poll (s) | cycle wall (s) med / max | requests per cycle | clients per "
          "cycle / all / open at end | CPU s per cycle | loop lag ms p50 / p99 / max | RSS KB per trigger | job end (s) p50 / p95 |")  # fmt: skip
    print("|---|--:|--:|--:|---|--:|--:|--:|--:|--:|")
    for r in results:
        first = (
            f"{r['first_poll_s']:.1f}" if r["first_poll_s"] == r["first_poll_s"] else f"> {r['window_s']:.0f}"
        )
        walls = [w for w in r["walls"] if w == w]
        wall = f"{statistics.median(walls):.2f} / {max(walls):.2f}" if walls else "-"
        ms = " / ".join(f"{x * 1000:.0f}" for x in r["lag"])
        end = "-"
        if "job_end" in r:
            p50, p95, seen, *wrote, want = r["job_end"]  # (older rows: no count of the ends written)
            end = (
                f"{p50:.1f} / {p95:.1f}" if seen == want else f"{p50:.1f} / {p95:.1f} ({seen} of {want} seen"
            )
            end += "" if seen == want else f", {wrote[0]} written)" if wrote else ")"
        clients = f"{fmt(steady(r, 'clients'))} / {sum(r['clients'].values())} / " + (
            "n/a" if r["open_clients"] is None else str(sum(r["open_clients"].values()))
        )
        print(f"| {r['label']} | {r['n']} | {first} | {wall} | {fmt_requests(steady(r, 'requests'))} | {clients} "
              f"| {steady(r, 'cpu'):.2f} | {ms} | {r['rss_kb']:.0f} | {end} |")  # fmt: skip
    print("\nPer poll cycle (window 0 holds the start of the N triggers):\n")
    print(
        "| implementation | N | window | requests | clients | CPU s | loop lag ms p50 / p99 / max | events |"
    )
    print("|---|--:|--:|---|--:|--:|--:|--:|")
    for r in results:
        for k, w in enumerate(r["windows"]):
            ms = " / ".join(f"{x * 1000:.0f}" for x in w["lag"])
            print(f"| {r['label']} | {r['n']} | {k} | {fmt_requests(w['requests'])} | {w['clients']} "
                  f"| {w['cpu']:.2f} | {ms} | {w['events']} |")  # fmt: skip
    print()
    for r in results:
        sim = r["sim"]
        notes = [f"triggers built in {r['built_s']:.2f} s" if r["built_s"] == r["built_s"] else "not all triggers built by the end", f"clients {r['clients']}", f"open at end {r['open_clients']}",
                 f"log events {r['logged']}", f"poll rounds per poller in the steady windows {r['cycles']:.2f}",
                 f"agents meanwhile: {sim['writes']} writes (took p99 {sim['put_p99']:.2f} s, max {sim['put_max']:.1f} s; began p99 {sim['lag_p99']:.1f} s late), {sim['errors']} errors"]  # fmt: skip
        if "gc_pauses" in r:
            count, wall, cpu = (r["gc_pauses"] + [NAN])[:3]
            notes.append(
                f"gc pauses > 50 ms: {count} (longest {wall * 1000:.0f} ms, {cpu * 1000:.0f} ms of it CPU)"
            )
        if "gc_tracked" in r:
            base, built_, frozen = (r["gc_tracked"] + [0])[:3]
            notes.append(f"objects a full collection walks: {base} before the triggers, {built_} once "
                         f"built ({(built_ + frozen - base) / r['n']:.0f} per trigger; {frozen} frozen)")  # fmt: skip
        if any(w.get("leases") for w in r["windows"]):
            notes.append(f"lease renewals per window: {[w.get('leases', 0) for w in r['windows']]} (each run's "
                         "lease once at its trigger's start, then once per 300 s: orphan_timeout 30 min)")  # fmt: skip
        if "job_end" in r:
            notes.append(
                f"ended runs: {r['outcomes']}, whole log shown for {r['log_complete']} of {r['job_end'][3]}"
            )
        print(f"- {r['label']}, N={r['n']}: " + "; ".join(notes))
        for stack, hits in [(s, h) for s, h in r["stacks"] if "triggerer_scale.py" not in s]:
            print(f"    - loop late > 100 ms ({hits} x 50 ms) in: {stack}")


def print_split(side: str, results: list[dict[str, Any]]) -> None:
    """With ``--triggerers K``: each process's share side by side (its own requests, counted by its
    probe, per cycle; the emulator's counts by API are the K processes' together)."""
    split = [r for r in results if r.get("triggerers", 1) > 1]
    if not split:
        return
    print(f"\n### {side}: the N triggers split over triggerer processes\n")
    print("| triggerer | triggers | own requests per cycle | all processes' requests per cycle by API "
          "| CPU s per cycle | loop lag ms p50 / p99 / max | job end (s) p50 / p95 |")  # fmt: skip
    print("|---|--:|--:|---|--:|--:|--:|")
    for r in split:
        ms = " / ".join(f"{x * 1000:.0f}" for x in r["lag"])
        end = f"{r['job_end'][0]:.1f} / {r['job_end'][1]:.1f}" if "job_end" in r else "-"
        print(f"| {r['label']} | {r['n']} | {fmt(steady(r, 'own'))} | {fmt_requests(steady(r, 'requests'))} "
              f"| {steady(r, 'cpu'):.2f} | {ms} | {end} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--clouds", nargs="+", choices=["aws", "gcp"], default=["aws", "gcp"])
    parser.add_argument("--impls", nargs="+", default=None, help="run only these (substrings of the names)")
    parser.add_argument("--interval", type=float, default=10.0, help="poll interval, seconds")
    parser.add_argument("--cycles", type=int, default=5, help="poll intervals measured per row")
    parser.add_argument("--line-s", type=float, default=1.5, help="a chatty job prints a line this often")
    parser.add_argument(
        "--quiet-share", type=float, default=0.2, help="share of jobs printing a line a minute"
    )
    parser.add_argument("--flush-s", type=float, default=10.0, help="an agent uploads a chunk this often")
    parser.add_argument("--beat-s", type=float, default=15.0, help="an agent writes its heartbeat this often")
    parser.add_argument(
        "--end-share", type=float, default=0.2, help="share of runs ending under the run trigger"
    )
    parser.add_argument(
        "--max-writes", type=float, default=150.0, help="the agents' writes per second, at most"
    )
    parser.add_argument("--threads", type=int, default=8, help="the agents' writer threads")
    parser.add_argument(
        "--triggerers",
        type=int,
        default=1,
        help="triggerer processes the N triggers are split over (each runs every K-th), at once",
    )
    parser.add_argument("--json", default=None, help="also append each row to this file (JSON lines)")
    parser.add_argument("--from-json", default=None, help="only print the tables of the rows in this file")
    parser.add_argument("--role", default="main", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role != "main":
        roles = {"emulator": serve_emulator, "agents": simulate, "measure": lambda: measure(read_message())}
        roles[args.role]()
        os._exit(0)  # leftover worker threads are not worth waiting for
    if args.from_json:
        rows = [json.loads(line) for line in Path(args.from_json).read_text().splitlines()]
        for side in args.clouds:
            print_tables(side, [r for r in rows if r["side"] == side], args)
            print_split(side, [r for r in rows if r["side"] == side])
        return 0
    emulator = child("emulator")
    started = ask(emulator)
    os.environ.update(started["env"], CT_BENCH_COUNTS=started["counts"])
    gce = json.loads(started["env"]["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])["extra"]["compute_endpoint"]
    settings = {k: v for k, v in vars(args).items() if k not in ("role", "sizes", "clouds", "impls")}
    try:
        for side in args.clouds:
            results = []
            for z, n in enumerate(args.sizes):
                t = time.monotonic()
                spec = {**settings, **agent_rates(args, n), "side": side, "n": n, "bucket": BUCKET,
                        "prefix": f"scale/{side}-{n}", "zone": ZONES[z % len(ZONES)], "gce": gce}  # fmt: skip
                sim = child("agents")
                runs_ = ask(sim, spec)["runs"]
                print(
                    f"[{side} N={n}: instances and agents ready in {time.monotonic() - t:.0f} s]",
                    file=sys.stderr,
                )
                for label, classpath in IMPLS[side]:
                    if not args.impls or any(s.lower() in label.lower() for s in args.impls):
                        t1 = time.monotonic()
                        rows = [{**r, "side": side} for r in run_config(label, classpath, sim, runs_, spec)]
                        results += rows
                        took = time.monotonic() - t1
                        print(f"[{side} N={n} {label}: {took:.0f} s]", file=sys.stderr, flush=True)
                        if args.json:
                            with open(args.json, "a") as out:
                                out.writelines(json.dumps({**r, "took_s": took}) + "\n" for r in rows)
                sim.stdin.close()  # type: ignore[union-attr]
                sim.wait()
                print(f"[{side} N={n}: {time.monotonic() - t:.0f} s in all]", file=sys.stderr, flush=True)
            print_tables(side, results, args)
            print_split(side, results)
    finally:
        emulator.stdin.close()  # type: ignore[union-attr]
        emulator.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
