"""Secret references: what ``secret_env`` values and ``RunSpec.secret_env`` hold instead of secrets.

Stdlib only: the operator parses them at DAG parse time, the agent (shipped in the agent zip) parses
them again on the instance to read each secret with the instance's own role / service account.

The accepted forms (``FORMS``)::

    aws-ssm://[region]/name/of/parameter     SSM parameter (SecureString or String); the name is the
                                             path, leading "/" included; no region: the instance's
    arn:aws:ssm:<region>:<account>:parameter/name/of/parameter   AWS's ARN of "/name/of/parameter";
    arn:aws:ssm:<region>:<account>:parameter/name       of the plain (no "/") name "name"
    aws-secretsmanager://[region]/name[#key] Secrets Manager secret; ``#key`` picks a key of its
    arn:aws:secretsmanager:<region>:<account>:secret:name[#key]           JSON SecretString
    gcp-secret://projects/P/secrets/S[/versions/V]     Secret Manager secret version (default latest)
    projects/P/secrets/S/versions/V
    airflow_conn://<conn_id>/<field>         resolved by the operator (login, password, host, schema,
                                             port, uri, extra or extra.<key>)
    airflow_var://<name>                     resolved by the operator

The operator resolves the two ``airflow_*`` forms at execute time and stores each value as a secret of
the run in the cloud's own store (``lifecycle.run_secrets``); the spec then holds that secret's
reference, so the agent only ever reads cloud references.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

AWS_SSM, AWS_SECRETSMANAGER, GCP_SECRET = "aws-ssm", "aws-secretsmanager", "gcp-secret"
AIRFLOW_CONN, AIRFLOW_VAR = "airflow_conn", "airflow_var"
CLOUD_OF = {AWS_SSM: "aws", AWS_SECRETSMANAGER: "aws", GCP_SECRET: "gcp"}  # the airflow_* forms: any
CONN_FIELDS = ("login", "password", "host", "schema", "port", "uri", "extra")

FORMS = (
    "'aws-ssm:///path/name' (or 'aws-ssm://<region>/path/name', 'arn:aws:ssm:...:parameter/...'), "
    "'aws-secretsmanager:///name[#key]' (or 'arn:aws:secretsmanager:...'), "
    "'gcp-secret://projects/P/secrets/S[/versions/V]' (or 'projects/P/secrets/S/versions/V'), "
    "'airflow_conn://<conn_id>/<field>', 'airflow_var://<name>'"
)

_REGION = r"(?:[a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-\d)?"
_AWS_URI = re.compile(rf"(aws-ssm|aws-secretsmanager)://({_REGION})(/[^#\s]+)(?:#([^#\s]+))?")
_SSM_ARN = re.compile(r"arn:aws[a-z-]*:ssm:([a-z0-9-]+):(\d{12}):parameter/([^\s#/][^\s#]*)")
_SM_ARN = re.compile(r"(arn:aws[a-z-]*:secretsmanager:([a-z0-9-]+):\d{12}:secret:[^\s#]+)(?:#([^#\s]+))?")
_GCP = re.compile(
    r"(?:gcp-secret://)?(projects/[a-z0-9-]{4,30}|projects/\d+)/secrets/([A-Za-z0-9_-]{1,255})"
    r"(?:/versions/(latest|[1-9]\d*))?"
)
_CONN = re.compile(
    r"airflow_conn://([A-Za-z0-9_.-]+)/(login|password|host|schema|port|uri|extra(?:\.[^\s/]+)?)"
)
_VAR = re.compile(r"airflow_var://([A-Za-z0-9_.-]+)")


@dataclass(frozen=True)
class SecretRef:
    """One parsed reference. ``name``: the SSM parameter name, the Secrets Manager secret id (name or
    ARN), the GCP version's full name, the connection id or the variable's name; ``region``: AWS only
    ("" = the instance's); ``field``: a Secrets Manager JSON key or a connection field; ``arn``: an SSM
    parameter's ARN when the reference gave one: it names the account (a parameter shared from another
    account is found by its ARN alone) and the partition."""

    scheme: str
    name: str
    region: str = ""
    field: str = ""
    arn: str = ""

    @property
    def cloud(self) -> str | None:
        """ "aws" or "gcp" for a cloud reference, None for ``airflow_*`` (resolved by the operator)."""
        return CLOUD_OF.get(self.scheme)

    @property
    def by_operator(self) -> bool:
        return self.scheme in (AIRFLOW_CONN, AIRFLOW_VAR)


def parse_ref(text: str) -> SecretRef | None:
    """The reference ``text`` names, or None when it is not one of ``FORMS``."""
    text = text.strip()
    if m := _AWS_URI.fullmatch(text):
        scheme, region, path, key = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        if scheme == AWS_SSM:
            return None if key else SecretRef(AWS_SSM, path, region)
        return SecretRef(AWS_SECRETSMANAGER, path.lstrip("/"), region, key)
    if m := _SSM_ARN.fullmatch(text):
        return SecretRef(AWS_SSM, ssm_name_of_arn(m.group(3)), m.group(1), arn=text)
    if m := _SM_ARN.fullmatch(text):
        return SecretRef(AWS_SECRETSMANAGER, m.group(1), m.group(2), m.group(3) or "")
    if m := _GCP.fullmatch(text):
        if not text.startswith("gcp-secret://") and not m.group(3):
            return None  # the bare form names its version, so a plain "projects/..." is not guessed at
        return SecretRef(GCP_SECRET, f"{m.group(1)}/secrets/{m.group(2)}/versions/{m.group(3) or 'latest'}")
    if m := _CONN.fullmatch(text):
        return SecretRef(AIRFLOW_CONN, m.group(1), field=m.group(2))
    if m := _VAR.fullmatch(text):
        return SecretRef(AIRFLOW_VAR, m.group(1))
    return None


def ssm_name_of_arn(resource: str) -> str:
    """The parameter name an SSM ARN's ``parameter/<resource>`` stands for. AWS writes a plain name
    (``token``) as ``parameter/token`` and a hierarchical one (``/team/token``: a name with a "/" must
    start with one) as ``parameter/team/token``, dropping its leading "/"; so a "/" inside
    ``resource`` means a hierarchy, whose name gets its "/" back, and none means a plain name."""
    return "/" + resource if "/" in resource else resource


def ssm_arn_resource(name: str) -> str:
    """The ``parameter/...`` resource of an SSM parameter's ARN (the inverse of ``ssm_name_of_arn``);
    IAM policies name parameters by it. A one-level ``/token`` shares ``parameter/token`` with
    ``token``: AWS's ARNs do not tell the two apart."""
    return "parameter/" + name.lstrip("/")


def ssm_ref(region: str, name: str) -> str:
    """The reference of an SSM parameter (``name`` starts with "/")."""
    return f"{AWS_SSM}://{region}{name}"


def gcp_ref(secret_name: str, version: str = "latest") -> str:
    """The reference of a Secret Manager secret (``projects/P/secrets/S``)."""
    return f"{GCP_SECRET}://{secret_name}/versions/{version}"


def redactions(values: list[str]) -> list[bytes]:
    """What to cut out of log text for these secret values, longest first: each value, and each line
    of a multi-line value on its own (a log stores a stamp after every newline)."""
    out: set[bytes] = set()
    for value in values:
        if len(value) < 3:  # too short to redact without mangling the log; the parse-time check warns
            continue
        out.add(value.encode("utf-8", "replace"))
        for line in value.splitlines():
            if len(line.strip()) >= 4:
                out.add(line.strip().encode("utf-8", "replace"))
    return sorted(out, key=len, reverse=True)


def redact(data: bytes, patterns: list[bytes]) -> bytes:
    for pattern in patterns:
        data = data.replace(pattern, b"***")
    return data
