"""What an emulated instance was given to boot: our bootstrap script, as ``contract/bootstrap.py`` renders it.

The emulator starts an agent only for instances whose EC2 user data / GCE ``startup-script`` is our
bootstrap, and reads from it what the real machine would act on. The lines read (values are shell
words, parsed with ``shlex``; the first assignment of each name counts)::

    CT_RUN_URI='s3://bucket/runs/...'   # required: without it the script is not ours (no agent)
    CT_CLOUD=ec2                        # ec2, ec2spot, gcloud or gcspot
    CT_HARD_STOP_S=3600                 # the machine powers itself off this long after boot; empty: never
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

_NAMES = ("CT_RUN_URI", "CT_CLOUD", "CT_HARD_STOP_S")


@dataclass(frozen=True)
class Bootstrap:
    run_uri: str
    cloud: str | None = None
    hard_stop_s: int | None = None


def _word(text: str) -> str | None:
    """The value of ``NAME=<text>`` when it is a single shell word (or nothing), else None."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # unbalanced quotes
        return None
    if len(words) > 1:
        return None
    return words[0] if words else ""


def parse_bootstrap(script: str | bytes | None) -> Bootstrap | None:
    """The bootstrap's settings, or None when ``script`` is not our bootstrap."""
    if isinstance(script, bytes):
        script = script.decode("utf-8", errors="replace")
    values: dict[str, str | None] = {}
    for line in (script or "").splitlines():
        name, sep, rest = line.partition("=")
        if sep and name in _NAMES and name not in values:
            values[name] = _word(rest)
    run_uri = values.get("CT_RUN_URI")
    if not run_uri:
        return None
    hard_stop: int | None = None
    raw = values.get("CT_HARD_STOP_S")
    if raw and raw.isdigit() and int(raw) > 0:
        hard_stop = int(raw)
    return Bootstrap(run_uri, values.get("CT_CLOUD") or None, hard_stop)
