"""What an AWS request to the moto server is (service, operation, protocol), and the errors AWS sends.

The SigV4 credential scope names the service (``Credential=AKID/20250101/us-east-1/s3/aws4_request``
in the Authorization header, or ``X-Amz-Credential`` in a presigned URL's query). Within it: query
protocols (EC2, STS, ...) carry ``Action=`` in the form; JSON ones ``X-Amz-Target: Service.Operation``;
S3 is REST, its operation read from the method, path and query (close enough for counting and
selecting: the common object, listing and multipart calls are named as the S3 API names them).
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"

_SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/[^/]+/([^/]+)/aws4_request")


@dataclass(frozen=True)
class Call:
    service: str  # the signing name: "ec2", "s3", "ssm", ...
    operation: str  # "DescribeInstances", "GetObject", "GetParameter", ...
    protocol: str  # "ec2", "query", "json", "s3" or "rest"


def classify(environ: dict[str, Any], form: dict[str, list[str]]) -> Call:
    query = environ.get("QUERY_STRING", "")
    scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", "")) or _SCOPE.search(unquote(query))
    service = scope.group(1) if scope else ""
    action = (form.get("Action") or parse_qs(query).get("Action") or [""])[0]
    if action:
        service = service or "ec2"
        return Call(service, action, "ec2" if service == "ec2" else "query")
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        prefix, _, operation = target.rpartition(".")
        return Call(service or prefix.lower(), operation, "json")
    if service in ("", "s3"):
        return Call("s3", s3_operation(environ), "s3")
    return Call(service, f"{environ.get('REQUEST_METHOD', 'GET')} {environ.get('PATH_INFO', '/')}", "rest")


def s3_operation(environ: dict[str, Any]) -> str:
    """The S3 API name of a path-style request (``GET /bucket?list-type=2`` -> ``ListObjectsV2``)."""
    method = environ.get("REQUEST_METHOD", "GET")
    bucket, _, key = environ.get("PATH_INFO", "/").lstrip("/").partition("/")
    q = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    if not bucket:
        return "ListBuckets"
    if not key:
        if method == "GET":
            if "uploads" in q:
                return "ListMultipartUploads"
            return "ListObjectsV2" if q.get("list-type") == ["2"] else "ListObjects"
        if method == "POST" and "delete" in q:
            return "DeleteObjects"
        return {"PUT": "CreateBucket", "DELETE": "DeleteBucket", "HEAD": "HeadBucket"}.get(
            method, f"{method}Bucket"
        )
    if "uploadId" in q:
        return {
            "GET": "ListParts",
            "PUT": "UploadPart",
            "POST": "CompleteMultipartUpload",
            "DELETE": "AbortMultipartUpload",
        }.get(method, "UploadPart")
    if method == "POST" and "uploads" in q:
        return "CreateMultipartUpload"
    if method == "PUT" and environ.get("HTTP_X_AMZ_COPY_SOURCE"):
        return "CopyObject"
    return {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PutObject", "DELETE": "DeleteObject"}.get(
        method, f"{method}Object"
    )


Reply = tuple[str, list[tuple[str, str]], bytes]  # status line, headers, body


def _reply(status: str, content_type: str, body: bytes, *extra: tuple[str, str]) -> Reply:
    return status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *extra], body


# how AWS refuses a request, per fault and protocol: (HTTP status, error code, message)
_REFUSALS: dict[str, dict[str, tuple[str, str, str]]] = {
    "throttled": {
        "ec2": ("503 Service Unavailable", "RequestLimitExceeded", "Request limit exceeded."),
        "s3": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
        "query": ("400 Bad Request", "Throttling", "Rate exceeded"),
        "json": ("400 Bad Request", "ThrottlingException", "Rate exceeded"),
        "rest-json": ("429 Too Many Requests", "ThrottlingException", "Rate exceeded"),
    },
    "unavailable": {
        "ec2": (
            "503 Service Unavailable",
            "Unavailable",
            "The server is overloaded and can't handle the request.",
        ),
        "s3": (
            "500 Internal Server Error",
            "InternalError",
            "We encountered an internal error. Please try again.",
        ),
        "query": ("503 Service Unavailable", "ServiceUnavailable", "Service is unavailable"),
        "json": ("500 Internal Server Error", "InternalFailure", "Internal failure"),
        "rest-json": ("503 Service Unavailable", "ServiceUnavailableException", "Service unavailable"),
    },
    # a bucket policy or an IAM change took the permission away: only S3 object writes get it
    # (``fail_writes(kind=DENIED)``); the other protocols would fall back to the rest-json answer
    "denied": {
        "s3": ("403 Forbidden", "AccessDenied", "Access Denied"),
        "rest-json": (
            "403 Forbidden",
            "AccessDeniedException",
            "User is not authorized to perform this action",
        ),
    },
}


def throttled(call: Call, method: str) -> Reply:
    """The answer AWS gives a throttled request, in the protocol of the call."""
    return refused(call, method, "throttled")


def unavailable(call: Call, method: str) -> Reply:
    """The server error AWS gives a request while the service has bad minutes, in the call's protocol
    (botocore retries each of these in its standard mode)."""
    return refused(call, method, "unavailable")


def refused(call: Call, method: str, fault: str) -> Reply:
    """A refused request (``fault``: ``throttled``, ``unavailable`` or ``denied``) in the protocol of the
    call."""
    rid = str(uuid.uuid4())
    table = _REFUSALS[fault]
    status, code, message = table.get(call.protocol, table["rest-json"])
    if call.protocol == "ec2":
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{rid}</RequestID></Response>"
        )
        return _reply(status, "text/xml;charset=UTF-8", body.encode())
    if call.protocol == "s3":
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{escape(message)}'
            f"</Message><RequestId>{rid}</RequestId><HostId>{rid}</HostId></Error>"
        )
        payload = b"" if method == "HEAD" else body.encode()
        return _reply(status, "application/xml", payload, ("x-amz-request-id", rid))
    if call.protocol == "query":
        kind = "Receiver" if fault == "unavailable" else "Sender"
        body = (
            f'<ErrorResponse xmlns="https://{call.service}.amazonaws.com/doc/"><Error><Type>{kind}</Type>'
            f"<Code>{code}</Code><Message>{escape(message)}</Message></Error>"
            f"<RequestId>{rid}</RequestId></ErrorResponse>"
        )
        return _reply(status, "text/xml", body.encode(), ("x-amzn-RequestId", rid))
    if call.protocol == "json":
        payload = json.dumps({"__type": code, "message": message}).encode()
        return _reply(status, "application/x-amz-json-1.1", payload, ("x-amzn-RequestId", rid))
    payload = json.dumps({"message": message}).encode()
    return _reply(status, "application/json", payload, ("x-amzn-ErrorType", code), ("x-amzn-RequestId", rid))


def capacity_error(instance_type: str, zone: str | None) -> Reply:
    """EC2's InsufficientInstanceCapacity for RunInstances (real EC2 sends it with HTTP 500)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InsufficientInstanceCapacity'
        f"</Code><Message>We currently do not have sufficient {instance_type} capacity in the Availability "
        f"Zone you requested ({zone or 'chosen by EC2'}). Our system will be working on provisioning "
        "additional capacity.</Message></Error></Errors><RequestID>cloudtrain-emulator</RequestID></Response>"
    )
    return _reply("500 Internal Server Error", "text/xml", body.encode())


def query_list(form: dict[str, list[str]], prefix: str) -> list[str]:
    """A query-protocol list: ``prefix.1``, ``prefix.2``, ... in order (``GroupName.1``)."""
    out = []
    n = 1
    while values := form.get(f"{prefix}.{n}"):
        out.append(values[0])
        n += 1
    return out


def ec2_ok(root: str, inner: str) -> Reply:
    """An EC2 (query protocol) answer: ``<root>`` with a request id and ``inner``'s XML."""
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{EC2_NS}"><requestId>{secrets.token_hex(16)}'
        f"</requestId>{inner}</{root}>"
    )
    return _reply("200 OK", "text/xml;charset=UTF-8", body.encode())


def ec2_error(code: str, message: str, status: str = "400 Bad Request") -> Reply:
    """An EC2 error answer: ``code`` and ``message`` (escaped), HTTP ``status``."""
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code><Message>'
        f"{escape(message)}</Message></Error></Errors><RequestID>{secrets.token_hex(16)}</RequestID></Response>"
    )
    return _reply(status, "text/xml;charset=UTF-8", body.encode())


def group_not_found(name: str) -> Reply:
    """Auto Scaling's answer for a group that does not exist (moto raises KeyError instead on some
    calls, e.g. SetInstanceProtection from a worker whose group was just deleted: an HTTP 500)."""
    return _autoscaling_validation_error(f"AutoScalingGroup name not found - {name}")


def instance_not_in_group(instance_id: str) -> Reply:
    """Auto Scaling's answer for an instance that is in no group (moto raises StopIteration instead on
    TerminateInstanceInAutoScalingGroup and SetInstanceHealth: an HTTP 500, e.g. for a worker leaving
    a group that its fleet's teardown has just scaled to 0)."""
    return _autoscaling_validation_error(
        f"Instance Id not found - No managed instance found for instance ID: {instance_id}"
    )


def _autoscaling_validation_error(message: str) -> Reply:
    rid = str(uuid.uuid4())
    body = (
        '<ErrorResponse xmlns="https://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type>'
        f"<Code>ValidationError</Code><Message>{escape(message)}</Message></Error>"
        f"<RequestId>{rid}</RequestId></ErrorResponse>"
    )
    return _reply("400 Bad Request", "text/xml", body.encode(), ("x-amzn-RequestId", rid))
