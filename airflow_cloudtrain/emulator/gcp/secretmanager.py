"""The emulated GCP Secret Manager (v1 REST subset) on a local HTTP server.

The real ``google.cloud.secretmanager_v1`` client talks to it over REST, the agent with plain HTTP::

    server = SecretManagerServer(); endpoint = server.start()      # "http://127.0.0.1:PORT"
    SecretManagerServiceClient(transport="rest", credentials=AnonymousCredentials(),
                               client_options={"api_endpoint": endpoint})

Served: ``secrets.create`` (``POST /v1/projects/P/secrets?secretId=S``; 409 ALREADY_EXISTS), ``get``,
``delete`` (404 NOT_FOUND), ``list`` (``filter`` of ``labels.K=V`` / ``name:S`` clauses joined by
AND or spaces; ``pageSize``/``pageToken``), ``addVersion``, ``versions.access`` (a version number or
``latest``, the newest enabled one). Secret ids are checked as the API checks them (400), another
project is 404; ``ttl`` becomes ``expireTime`` and a secret past it is gone. Errors are Google's JSON
(``error.code``/``message``/``status``). Requests are counted per operation (``counts()``), except
the emulator's own, and can be throttled (service ``"secretmanager"``: HTTP 429
RESOURCE_EXHAUSTED).

Not emulated: regional secrets (``locations/*``), IAM, rotation, version disable/destroy, etags,
replication policies (kept as given), CMEK.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from typing import Any

from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.faults import Throttle
from airflow_cloudtrain.emulator.gcp.rest import GoogleError, GoogleRestServer

__all__ = ["SecretManagerServer"]

_SECRET_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")
_TTL = re.compile(r"(\d+(?:\.\d+)?)s")
_CLAUSE = re.compile(r"""(labels\.[\w-]+|name)\s*([=:])\s*("[^"]*"|'[^']*'|\S+)""")


class SecretError(GoogleError):
    """An error in Google's JSON shape (``error.code``/``message``/``status``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


def _rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"


class SecretManagerServer(GoogleRestServer):
    """Secret Manager v1 on 127.0.0.1 (random port) in a daemon thread; module doc. Requests take the
    shared pipeline (``rest``)."""

    service = "secretmanager"
    thread_name = "secretmanager-emulator"

    def __init__(self, project: str = "cloudtrain-emulated", throttle: Throttle | None = None) -> None:
        p, s = "/v1/projects/<project>/secrets", "/v1/projects/<project>/secrets/<secret>"
        rules = [
            Rule(p, endpoint="secrets.create", methods=["POST"]),
            Rule(p, endpoint="secrets.list", methods=["GET"]),
            Rule(s, endpoint="secrets.get", methods=["GET"]),
            Rule(s, endpoint="secrets.delete", methods=["DELETE"]),
            Rule(f"{s}:addVersion", endpoint="secrets.addVersion", methods=["POST"]),
            Rule(f"{s}/versions/<version>:access", endpoint="versions.access", methods=["GET"]),
        ]
        super().__init__(rules, throttle)
        self.project = project
        self._lock = threading.Lock()
        self._secrets: dict[str, dict[str, Any]] = {}  # full name -> resource (+ "_versions", "_expires")

    def secrets(self) -> list[dict[str, Any]]:
        """Every secret alive now, as ``secrets.get`` shows it (tests: what a run left behind)."""
        with self._lock:
            self._expire()
            return [self._public(s) for s in self._secrets.values()]

    # --- state -----------------------------------------------------------------------------------

    def _expire(self) -> None:
        now = time.time()
        for name in [n for n, s in self._secrets.items() if s["_expires"] and s["_expires"] <= now]:
            del self._secrets[name]

    def _secret(self, name: str) -> dict[str, Any]:
        self._expire()
        secret = self._secrets.get(name)
        if secret is None:
            raise SecretError(404, f"Secret [{name}] not found or has no versions.")
        return secret

    @staticmethod
    def _public(secret: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in secret.items() if not k.startswith("_")}

    # --- HTTP ------------------------------------------------------------------------------------

    def throttled(self, service: str) -> SecretError:
        return SecretError(
            429,
            "Quota exceeded for quota metric 'secretmanager.googleapis.com/access_requests' "
            "and limit 'requests per minute' of service 'secretmanager.googleapis.com'.",
        )

    def handle(self, op: str, request: Request, args: dict[str, Any]) -> Any:
        """The one project served (another is 404); the handlers run under the lock."""
        if args.pop("project") != self.project:
            raise SecretError(404, "Requested project not found or user does not have access to it.")
        with self._lock:
            return super().handle(op, request, args)

    def _full(self, secret: str) -> str:
        return f"projects/{self.project}/secrets/{secret}"

    def _h_secrets_create(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        secret_id = req.args.get("secretId") or req.args.get("secret_id") or ""
        if not _SECRET_ID.fullmatch(secret_id):
            raise SecretError(
                400, f"Secret id [{secret_id}] is invalid: use 1 to 255 letters, digits, '-' or '_'."
            )
        self._expire()
        name = self._full(secret_id)
        if name in self._secrets:
            raise SecretError(409, f"Secret [{name}] already exists.")
        now = time.time()
        expires = None
        if body.get("ttl"):
            m = _TTL.fullmatch(str(body["ttl"]))
            if not m:
                raise SecretError(400, f"Invalid value at 'secret.ttl' ({body['ttl']!r}).")
            expires = now + float(m.group(1))
        secret: dict[str, Any] = {
            "name": name,
            "replication": body.get("replication") or {"automatic": {}},
            "createTime": _rfc3339(now),
            "labels": body.get("labels") or {},
            "etag": f'"{int(now * 1e6):x}"',
            "_versions": [],
            "_expires": expires,
        }
        if expires:
            secret["expireTime"] = _rfc3339(expires)
        self._secrets[name] = secret
        return self._public(secret)

    def _h_secrets_get(self, req: Request, body: dict[str, Any], secret: str) -> dict[str, Any]:
        return self._public(self._secret(self._full(secret)))

    def _h_secrets_delete(self, req: Request, body: dict[str, Any], secret: str) -> dict[str, Any]:
        name = self._full(secret)
        self._secret(name)
        del self._secrets[name]
        return {}

    def _h_secrets_list(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        self._expire()
        clauses = _parse_filter(req.args.get("filter") or "")
        found = [self._public(s) for s in self._secrets.values() if _matches(s, clauses)]
        start = int(req.args.get("pageToken") or 0)
        size = int(req.args.get("pageSize") or 0) or 25000
        out: dict[str, Any] = {"totalSize": len(found)}
        if found[start : start + size]:
            out["secrets"] = found[start : start + size]
        if start + size < len(found):
            out["nextPageToken"] = str(start + size)
        return out

    def _h_secrets_addVersion(self, req: Request, body: dict[str, Any], secret: str) -> dict[str, Any]:
        record = self._secret(self._full(secret))
        data = (body.get("payload") or {}).get("data", "")
        try:
            base64.b64decode(data, validate=True)
        except ValueError:
            raise SecretError(400, "Invalid value at 'payload.data' (TYPE_BYTES): not base64.") from None
        number = len(record["_versions"]) + 1
        record["_versions"].append(data)
        return {
            "name": f"{record['name']}/versions/{number}",
            "createTime": _rfc3339(time.time()),
            "state": "ENABLED",
        }

    def _h_versions_access(
        self, req: Request, body: dict[str, Any], secret: str, version: str
    ) -> dict[str, Any]:
        record = self._secret(self._full(secret))
        versions = record["_versions"]
        if version == "latest":
            number = len(versions)
        elif version.isdigit():
            number = int(version)
        else:
            raise SecretError(400, f"Invalid secret version [{version}]: use a number or 'latest'.")
        if not 1 <= number <= len(versions):
            raise SecretError(404, f"Secret Version [{record['name']}/versions/{version}] not found.")
        return {"name": f"{record['name']}/versions/{number}", "payload": {"data": versions[number - 1]}}


def _parse_filter(text: str) -> list[tuple[str, str, str]]:
    """``labels.k=v AND name:foo`` -> [("labels.k", "=", "v"), ("name", ":", "foo")]; else 400."""
    text = re.sub(r"\s+AND\s+", " ", text.strip(), flags=re.IGNORECASE)
    clauses, pos = [], 0
    while pos < len(text):
        m = _CLAUSE.match(text, pos)
        if not m:
            raise SecretError(
                400, f"Invalid filter [{text}]: only labels.KEY=VALUE and name:TEXT are supported."
            )
        value = m.group(3)
        clauses.append((m.group(1), m.group(2), value[1:-1] if value[:1] in "\"'" else value))
        pos = m.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    return clauses


def _matches(secret: dict[str, Any], clauses: list[tuple[str, str, str]]) -> bool:
    for key, _op, value in clauses:
        if key == "name":
            if value not in secret["name"].rsplit("/", 1)[-1]:
                return False
        elif secret["labels"].get(key.split(".", 1)[1]) != value:
            return False
    return True
