"""The job's working directory on the instance: default location, code tarball, attached volume.

The volume follows the job across spot interruptions (the reference recipe's EBS volume at
/mnt/data), so mounting it is worth a try, but only a try: a missing device or a non-root agent (the
emulator) must not fail the run, it only gets noted in the log.

The code tarball is downloaded through ``agent.retry.retry``: a throttled or briefly unreachable
bucket at start must not fail a run that has not begun.
"""

from __future__ import annotations

import glob
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from airflow_cloudtrain.contract.retry import retry
from airflow_cloudtrain.storage import RunFolder

ROOT_WORKDIR = "/var/lib/cloudtrain/work"


def default_workdir(instance_id: str) -> str:
    """Root (a real instance) works on the big disk; anyone else (tests, the emulator) in a temp dir."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return os.path.join(ROOT_WORKDIR, instance_id)
    return tempfile.mkdtemp(prefix=f"cloudtrain-{instance_id}-")


def fetch_code(folder: RunFolder, code_uri: str, workdir: Path) -> None:
    """Download the ``code`` tarball (any s3:// / gs:// URI, or a key of the run folder) and unpack it."""
    with tempfile.TemporaryDirectory(prefix="cloudtrain-code-") as tmp:
        archive = os.path.join(tmp, "code.tar.gz")
        retry(lambda: folder.download(code_uri, archive), what="code download")
        unpack_tarball(archive, str(workdir))


def unpack_tarball(archive: str, dest: str) -> None:
    """Extract ``archive`` into ``dest``, refusing members that would land outside it."""
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        root = Path(dest).resolve()
        for member in tar.getmembers():
            target = (root / member.name).resolve()
            if root != target and root not in target.parents:
                raise ValueError(f"unsafe path in code tarball: {member.name!r}")
            if member.issym() or member.islnk():
                raise ValueError(f"links are not allowed in the code tarball: {member.name!r}")
        tar.extractall(dest)  # members checked above (a Python without tarfile filters)


def resolve_device(device: str) -> str | None:
    """A device path for ``volume_device``: a /dev path, an EBS volume id or a GCE disk name."""
    if device.startswith("/dev/"):
        return device if os.path.exists(device) else None
    if device.startswith("vol-"):  # Nitro instances expose EBS volumes as NVMe with the id as serial
        pattern = f"/dev/disk/by-id/*{device.replace('-', '')}"
    else:
        pattern = f"/dev/disk/by-id/google-{device}"
    matches = sorted(glob.glob(pattern))
    return matches[0] if matches else None


def mount_volume(device: str, mount_point: str, note: Callable[[str], None]) -> bool:
    """Best effort: mount ``device`` at ``mount_point``; True when it is mounted afterwards."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        note(f"volume {device}: agent is not root, not mounting it")
        return False
    path = resolve_device(device)
    if path is None:
        note(f"volume {device}: no such device on this machine, not mounted")
        return False
    if os.path.ismount(mount_point):
        note(f"volume {device}: {mount_point} is already mounted")
        return True
    try:
        os.makedirs(mount_point, exist_ok=True)
        done = subprocess.run(["mount", path, mount_point], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        note(f"volume {device}: mount failed: {err}")
        return False
    if done.returncode != 0:
        note(f"volume {device}: mount {path} failed ({done.returncode}): {done.stderr.strip()[:300]}")
        return False
    note(f"volume {device}: mounted {path} at {mount_point}")
    return True
