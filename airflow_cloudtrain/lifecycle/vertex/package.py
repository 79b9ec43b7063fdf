"""A local ``code`` folder as the Python source distribution Vertex AI installs on every replica.

Vertex's ``pythonPackageSpec`` takes ``gs://`` URIs of packages that ``pip install`` can install; ML
Engine users ran ``python setup.py sdist`` and uploaded the result by hand (the detector's tool baked
that in). A folder with its own ``setup.py`` / ``pyproject.toml`` is packed as it is; any other folder
gets a minimal ``setup.py`` that installs its packages and top-level modules. The archive is
deterministic (sorted names, fixed times and owners), so its content hash names its upload: a retried
task or a resumed job reuses the same object instead of uploading it again. Caches, ``.git``, virtual
environments and local secrets (``.env*``, ``.netrc``, ``.pypirc``, ``*.pem``, ``*.key``, ``*.p12``) are
left out: the package lands in a bucket.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_cloudtrain.storage import RunFolder

NAME, VERSION = "cloudtrain_job", "0.0.0"
SKIP_DIRS = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
# never shipped: local secrets that sit next to code (the package lands in a bucket others may read)
SKIP_FILES = (".env", ".netrc", ".pypirc")
SKIP_SUFFIXES = (".pyc", ".pyo", ".pem", ".key", ".p12")

_SETUP = """from setuptools import find_packages, setup

setup(
    name="{name}",
    version="{version}",
    packages=find_packages(),
    py_modules={modules!r},
    include_package_data=True,
)
"""


def _files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(SKIP_SUFFIXES) and not name.startswith(SKIP_FILES):
                out.append(Path(dirpath) / name)
    return out


def _add(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
    info = tarfile.TarInfo(arcname)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def build_sdist(folder: str | os.PathLike[str]) -> tuple[str, bytes]:
    """(file name, bytes) of a ``.tar.gz`` source distribution of ``folder``."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"code={str(folder)!r} is not a directory")
    files = _files(root)
    if not files:
        raise ValueError(f"code={str(folder)!r} is empty: nothing to package")
    top = f"{NAME}-{VERSION}"
    buffer = io.BytesIO()
    # gzip with mtime 0: the same folder gives the same bytes
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        own_build = (root / "setup.py").exists() or (root / "pyproject.toml").exists()
        if not own_build:
            modules = sorted(p.stem for p in root.glob("*.py") if p.name != "setup.py")
            setup = _SETUP.format(name=NAME, version=VERSION, modules=modules)
            _add(tar, f"{top}/setup.py", setup.encode())
        _add(tar, f"{top}/PKG-INFO", f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n".encode())
        for path in files:
            _add(tar, f"{top}/{path.relative_to(root).as_posix()}", path.read_bytes())
    return f"{top}.tar.gz", buffer.getvalue()


def upload_package(folder: str | os.PathLike[str], job_folder: RunFolder) -> str:
    """Upload the package under ``<job folder>/packages/<content hash>/`` (once); its gs:// URI."""
    name, data = build_sdist(folder)
    key = f"packages/{hashlib.sha256(data).hexdigest()[:16]}/{name}"
    if job_folder.get_bytes(key) is None:
        job_folder.put_bytes(key, data)
    return f"{job_folder.uri}/{key}"
