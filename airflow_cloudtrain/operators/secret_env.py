"""``secret_env``: checked at DAG parse time, and again once templates are rendered.

Each value must be a secret reference (``agent.secret_refs.FORMS``) of the task's cloud or an
``airflow_conn://`` / ``airflow_var://`` one; a plain value belongs in ``env`` (which is stored in plain
text in the run folder), so it is refused here rather than shipped as if it were safe.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_cloudtrain.contract.secret_refs import FORMS, parse_ref
from airflow_cloudtrain.operators.config import is_templated

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CLOUD_OF = {"ec2": "aws", "ec2spot": "aws", "gcloud": "gcp", "gcspot": "gcp"}
_FORMS_OF = {
    "aws": "'aws-ssm:///path/name', 'arn:aws:ssm:...:parameter/...', 'aws-secretsmanager:///name[#key]', "
    "'arn:aws:secretsmanager:...'",
    "gcp": "'gcp-secret://projects/P/secrets/S[/versions/V]', 'projects/P/secrets/S/versions/V'",
}


def check_secret_env(secret_env: Any, cloud: Any, env: Any) -> dict[str, str] | None:
    """Parse time: every known entry checked; the references once nothing is templated, else None."""
    if is_templated(secret_env):
        if isinstance(secret_env, dict):
            known = {k: v for k, v in secret_env.items() if not is_templated(v)}
            parse_secret_env(known, cloud, env)
        return None
    return parse_secret_env(secret_env, cloud, env)


def parse_secret_env(secret_env: Any, cloud: Any, env: Any) -> dict[str, str]:
    """``{VAR: reference}``; ValueError naming the variable, the value and the accepted forms.

    ``cloud`` / ``env`` still templated (or not valid: their own checks say so) skip the checks that
    need them."""
    if secret_env is None:
        return {}
    if not isinstance(secret_env, dict):
        raise ValueError(
            f"secret_env={secret_env!r} is not valid: use a dict of environment variable names to "
            f"secret references, e.g. {{'API_TOKEN': 'aws-ssm:///team/api-token'}}"
        )
    provider = _CLOUD_OF.get(cloud) if isinstance(cloud, str) else None
    out: dict[str, str] = {}
    for var, text in secret_env.items():
        if not isinstance(var, str) or not _NAME.fullmatch(var):
            raise ValueError(
                f"secret_env key {var!r} is not valid: use an environment variable name (letters, "
                "digits and _, not starting with a digit)"
            )
        if var.startswith("CLOUDTRAIN_"):
            raise ValueError(
                f"secret_env[{var!r}] is not valid: names starting with CLOUDTRAIN_ are the agent's own; "
                "use another name"
            )
        if isinstance(env, dict) and not is_templated(env) and var in env:
            raise ValueError(
                f"secret_env[{var!r}] is also in env: give each variable once (a secret in secret_env, "
                "a plain value in env)"
            )
        if not isinstance(text, str):
            raise ValueError(
                f"secret_env[{var!r}]={text!r} is not valid: use a secret reference string, one of {FORMS}"
            )
        ref = parse_ref(text)
        if ref is None:
            scheme = text.split("://", 1)[0] if "://" in text else ""
            what = f"its scheme {scheme!r} is unknown" if scheme else "it is not a secret reference"
            raise ValueError(
                f"secret_env[{var!r}]={_shown(text)} is not valid: {what}. Put plain values in env and "
                f"secrets in secret_env: use a reference, {FORMS}"
            )
        if provider and ref.cloud and ref.cloud != provider:
            raise ValueError(
                f"secret_env[{var!r}]={text!r} is a {ref.cloud.upper()} secret but cloud={cloud!r} runs "
                f"on {provider.upper()}: the instance reads it with its own identity, so use "
                f"{_FORMS_OF[provider]}, or 'airflow_conn://<conn_id>/<field>' / 'airflow_var://<name>'"
            )
        out[var] = text.strip()
    return out


def _shown(text: str) -> str:
    """A value that is not a reference may be the secret itself: never echo it whole."""
    if "://" in text:
        return repr(text)
    return repr(text[:2] + "..." if len(text) > 4 else "...")
