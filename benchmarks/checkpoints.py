"""How fast do big checkpoints go up and come back, in how much memory, and does a spot notice leave
time for them? Measured on the emulated clouds (moto's S3 server, the emulated GCS), real clients.

For each size (``--sizes``, GB; 1, 4 and 16 by default) a checkpoint file is written once to a temp
dir (a 16 MiB random block repeated, each copy stamped with its index, so no two parts are alike).
Per cloud (``--clouds``), each in a fresh Python process whose peak RSS (VmHWM of
``/proc/self/status``) is read at its end:

  ours up / down   ``RunFolder.send_file`` / ``fetch_file`` (``airflow_cloudtrain.transfer``: parts of
                   16 MiB, 8 in flight; S3 multipart, GCS parallel composite; ranged parallel restore)
  naive up / down  what ``RunFolder`` did before: boto3's ``upload_file`` / ``download_file`` with its
                   defaults (s3transfer: 8 MiB parts, 10 threads, nothing resumable) and GCS's
                   ``upload_from_filename`` / ``download_to_filename`` (one resumable session, one stream)
  agent SIGTERM    the real agent (``python -m airflow_cloudtrain.agent``) runs a job that has the
                   checkpoint already written (a hard link into its checkpoint dir) and waits; the agent
                   gets SIGTERM (the way an instance going away stops it); measured: time from the
                   signal to the checkpoint's ``MANIFEST.json`` in the bucket (the agent stops the job,
                   hashes the file, uploads it, then the manifest) and the agent's own VmHWM.

Goals: the uploading process stays under 300 MB whatever the size; 10 GB fits in AWS's 120 s notice at
the emulator's throughput. The emulators run inside this process and keep big objects on disk
(moto's spooled files, a completed multipart upload streamed into one: ``emulator.aws.bigkeys``; the
emulated GCS's files, composes as hard links: ``emulator.gcp.gcs_disk``), so a case needs disk, about
three times its size (the checkpoint, the object, the restored copy; S3's parts for a moment): a size
the free disk cannot hold is skipped and said so. The process's own peak RSS during a case (its
VmHWM, reset before the case through ``/proc/self/clear_refs``) is the emulators' memory
("emulator peak"). GCS soft delete is turned off on the bucket used (as a user may: retention 0),
or every deleted part and object would stay on disk for 7 days, as they stay billed on GCS.

    python benchmarks/checkpoints.py [--sizes 1,4,16] [--clouds s3,gs] [--no-agent] [--no-naive]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GB = 1024**3
MB = 1024**2
MEMORY_GOAL_MB = 300
NOTICES = {"AWS (EC2 spot)": 120.0, "GCE (spot / preemptible)": 30.0}

CHILD = r"""
import json, sys, time
mode, uri, key, path = sys.argv[1:5]
from airflow_cloudtrain.storage import open_run_folder
folder = open_run_folder(uri)
full, started, parts = folder._full(key), time.monotonic(), None
if mode == "ours-up":
    parts = folder.send_file(path, key).parts
elif mode == "ours-down":
    parts = folder.fetch_file(key, path).parts
elif folder.scheme == "s3":
    client = folder._backend().client
    if mode == "naive-up":
        client.upload_file(path, folder.bucket, full)
    else:
        client.download_file(folder.bucket, full, path)
else:
    blob = folder._backend().client.bucket(folder.bucket).blob(full)
    if mode == "naive-up":
        blob.upload_from_filename(path)
    else:
        blob.download_to_filename(path)
seconds = time.monotonic() - started
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over execve, so it would report the parent's peak
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print(json.dumps({"s": seconds, "rss_mb": int(hwm.split()[1]) / 1024, "parts": parts}))
"""


@dataclass
class Row:
    cloud: str
    size_gb: float
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: str = ""


def reset_own_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux 4.0+: ``5`` to ``clear_refs``)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def no_soft_delete(bucket: str) -> None:
    """Turn GCS soft delete off on ``bucket`` of the emulated GCS (retention 0, as a user may)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    store = storage.Client(project="cloudtrain-emulated", credentials=AnonymousCredentials()).bucket(bucket)
    store.reload()
    store.soft_delete_policy.retention_duration_seconds = 0
    store.patch()


def write_checkpoint(path: Path, size: int) -> None:
    block = bytearray(os.urandom(16 * MB))
    with open(path, "wb") as handle:
        written, index = 0, 0
        while written < size:
            block[:8] = index.to_bytes(8, "little")
            chunk = block[: min(len(block), size - written)]
            handle.write(chunk)
            written += len(chunk)
            index += 1


def child(mode: str, uri: str, key: str, path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, uri, key, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} failed: {out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def wait_for(condition: Any, timeout: float, message: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {message} within {timeout:.0f} s")
        time.sleep(interval)
    return value


def vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def agent_sigterm(emu: Any, scheme: str, data: Path, tmp: Path) -> dict[str, Any]:
    """The real agent with the checkpoint written; SIGTERM; seconds until its manifest is in the bucket."""
    from airflow_cloudtrain.contract import runs
    from airflow_cloudtrain.storage import open_run_folder

    iid = f"{'i' if scheme == 's3' else 'vm'}-{uuid.uuid4().hex[:12]}"
    folder = open_run_folder(f"{scheme}://cloudtrain-emulated/bench/ckpt/{uuid.uuid4().hex[:8]}/-1")
    marker = tmp / f"linked-{iid}"
    command = (
        'mkdir -p "$CLOUDTRAIN_CHECKPOINT_DIR" && '
        f'ln {data} "$CLOUDTRAIN_CHECKPOINT_DIR/ckpt-00001.bin" && touch {marker} && exec sleep 3600'
    )
    spec = runs.RunSpec(
        run_id="ct-bench",
        run_uri=folder.uri,
        cloud="ec2spot" if scheme == "s3" else "gcspot",
        command=command,
        log_interval_s=1.0,
        heartbeat_interval_s=1.0,
        metadata_poll_s=1.0,
        checkpoint_interval_s=3600.0,  # no periodic round: only the final one, after the signal
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    env = {
        **os.environ,
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": emu.metadata.endpoint_for(iid),
        "GCE_METADATA_HOST": emu.metadata.gce_host_for(iid),
    }
    env.pop("PYTHONPATH", None)
    argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", folder.uri]
    argv += ["--instance-id", iid, "--workdir", str(tmp / iid)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0.0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            value = vm_hwm_mb(proc.pid)
            if value:
                peak[0] = max(peak[0], value)
            stop.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=300, message="job linked")
        if proc.poll() is not None:
            raise RuntimeError(f"agent ended early: {proc.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: folder.get_text(runs.manifest_key(1)) is not None or proc.poll() is not None,
            timeout=3600,
            interval=0.05,
            message="the manifest",
        )
        seconds = time.monotonic() - sent
        if folder.get_text(runs.manifest_key(1)) is None:
            raise RuntimeError("the agent ended without the manifest")
        proc.wait(timeout=600)
    finally:
        stop.set()
        watcher.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        folder.delete_prefix("")
        shutil.rmtree(tmp / iid, ignore_errors=True)
    return {"s": seconds, "rss_mb": peak[0]}


def run(args: argparse.Namespace) -> list[Row]:
    from airflow_cloudtrain.emulator import Emulator
    from airflow_cloudtrain.storage import open_run_folder

    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix="cloudtrain-ckpt-bench-", dir=args.tmp))
    try:
        with Emulator() as emu:
            if "gs" in args.clouds:
                no_soft_delete("cloudtrain-emulated")
            for size_gb in args.sizes:
                size = int(size_gb * GB)
                free_disk = shutil.disk_usage(tmp).free
                if free_disk < 3 * size + 2 * GB:
                    for cloud in args.clouds:
                        rows.append(Row(cloud, size_gb, skipped=f"{free_disk / GB:.0f} GB of disk free"))
                    continue
                data = tmp / f"ckpt-{size_gb}g.bin"
                write_checkpoint(data, size)
                for cloud in args.clouds:
                    row = Row(cloud, size_gb)
                    rows.append(row)
                    reset = reset_own_peak()
                    measure(emu, row, cloud, data, tmp, args, open_run_folder)
                    if reset:
                        row.results["emulator"] = {"rss_mb": vm_hwm_mb(os.getpid())}
                    print(
                        f"{cloud} {size_gb} GB emulator: {json.dumps(row.results.get('emulator'))}",
                        flush=True,
                    )
                data.unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def measure(
    emu: Any, row: Row, cloud: str, data: Path, tmp: Path, args: argparse.Namespace, opener: Any
) -> None:
    size = data.stat().st_size
    modes = ["ours"] + ([] if args.no_naive else ["naive"])
    for mode in modes:
        uri = f"{cloud}://cloudtrain-emulated/bench/ckpt/{uuid.uuid4().hex[:8]}/-1"
        back = tmp / "restored.bin"
        try:
            up = child(f"{mode}-up", uri, "checkpoints/1/ckpt-00001.bin", data)
            down = child(f"{mode}-down", uri, "checkpoints/1/ckpt-00001.bin", back)
            if back.stat().st_size != size:
                raise RuntimeError(f"{mode}: restored {back.stat().st_size} bytes of {size}")
            row.results[mode] = {"up": up, "down": down}
        finally:
            back.unlink(missing_ok=True)
            opener(uri).delete_prefix("")
        print(f"{cloud} {row.size_gb} GB {mode}: {json.dumps(row.results[mode])}", flush=True)
    if not args.no_agent:
        row.results["agent"] = agent_sigterm(emu, cloud, data, tmp)
        print(f"{cloud} {row.size_gb} GB agent: {json.dumps(row.results['agent'])}", flush=True)


def mbps(size_gb: float, seconds: float) -> float:
    return size_gb * GB / MB / seconds


def print_tables(rows: list[Row]) -> None:
    print()
    head = (
        "| cloud | size | ours up MB/s | ours down MB/s | ours peak RSS up / down (MB) | naive up MB/s | "
        "naive down MB/s | naive peak RSS up / down (MB) | agent: SIGTERM to manifest (s) | agent VmHWM (MB) | "
        "emulator peak RSS (MB) |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for row in rows:
        name = {"s3": "S3 (moto)", "gs": "GCS (emulator)"}[row.cloud]
        if row.skipped:
            print(f"| {name} | {row.size_gb:g} GB | skipped: {row.skipped} |" + " |" * 8)
            continue
        cells = [name, f"{row.size_gb:g} GB"]
        for mode in ("ours", "naive"):
            got = row.results.get(mode)
            if got is None:
                cells += ["-", "-", "-"]
                continue
            cells += [
                f"{mbps(row.size_gb, got['up']['s']):.0f}",
                f"{mbps(row.size_gb, got['down']['s']):.0f}",
                f"{got['up']['rss_mb']:.0f} / {got['down']['rss_mb']:.0f}",
            ]
        agent = row.results.get("agent")
        cells += [f"{agent['s']:.1f}", f"{agent['rss_mb']:.0f}"] if agent else ["-", "-"]
        emulator = row.results.get("emulator")
        cells.append(f"{emulator['rss_mb']:.0f}" if emulator and emulator.get("rss_mb") else "-")
        print("| " + " | ".join(cells) + " |")
    worst = max(
        (
            r.results[m][d]["rss_mb"]
            for r in rows
            for m in ("ours",)
            if m in r.results
            for d in ("up", "down")
        ),
        default=0.0,
    )
    agents = [r.results["agent"]["rss_mb"] for r in rows if "agent" in r.results]
    print(
        f"\nmemory goal (< {MEMORY_GOAL_MB} MB): ours peak {worst:.0f} MB, agent peak "
        f"{max(agents, default=0.0):.0f} MB: {'met' if max([worst, *agents]) < MEMORY_GOAL_MB else 'MISSED'}"
    )
    print(
        "\nhow big a checkpoint each notice carries, at the end-to-end agent rate (size / SIGTERM-to-manifest):"
    )
    for cloud in sorted({r.cloud for r in rows}):
        timed = [r for r in rows if r.cloud == cloud and "agent" in r.results]
        if not timed:
            continue
        biggest = max(timed, key=lambda r: r.size_gb)
        rate = biggest.size_gb / biggest.results["agent"]["s"]  # GB/s
        carried = ", ".join(f"{notice}: {rate * seconds:.1f} GB" for notice, seconds in NOTICES.items())
        print(f"  {cloud}: {rate * 1024:.0f} MB/s ({biggest.size_gb:g} GB case) -> {carried}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,4,16", help="checkpoint sizes in GB, comma-separated")
    p.add_argument("--clouds", default="s3,gs", help="s3, gs or both")
    p.add_argument("--no-agent", action="store_true", help="skip the agent SIGTERM measurement")
    p.add_argument("--no-naive", action="store_true", help="skip the naive (previous) transfer")
    p.add_argument("--tmp", default=None, help="where the checkpoint files are written (default: $TMPDIR)")
    args = p.parse_args(argv)
    args.sizes = [float(s) for s in args.sizes.split(",") if s]
    args.clouds = [c for c in args.clouds.split(",") if c]
    if not set(args.clouds) <= {"s3", "gs"}:
        p.error(f"--clouds takes s3 and/or gs, got {args.clouds}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"sizes {args.sizes} GB, clouds {args.clouds}; {os.cpu_count()} CPUs", flush=True)
    print_tables(run(args))


if __name__ == "__main__":
    main()
