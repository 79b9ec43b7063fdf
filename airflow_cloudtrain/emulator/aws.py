"""The emulated AWS: moto's server on loopback, plus what moto cannot do by itself.

A thin WSGI layer in front of moto injects the failures clouds have (InsufficientInstanceCapacity
for a type, optionally in one zone) and counts requests per action, so benchmarks can measure how
many EC2 calls a poll costs. Spot interruptions and instance-initiated shutdowns are played on
moto's in-process backend with the state reasons EC2 reports for them.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections import Counter
from typing import Any

from airflow_cloudtrain.emulator.serving import InThread

EMULATOR_USER_AGENT = "cloudtrain-emulator"
ACCOUNT_ID = "123456789012"
GPU_IMAGE_PARAM = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
)

_CAPACITY_ERROR = """<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>InsufficientInstanceCapacity</Code><Message>We currently do not have sufficient {itype} capacity in the Availability Zone you requested ({zone}). Our system will be working on provisioning additional capacity.</Message></Error></Errors><RequestID>cloudtrain-emulator</RequestID></Response>"""


class FaultsAndCounts:
    """WSGI middleware: capacity faults on RunInstances, and a count of requests per action."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.capacity_faults: set[tuple[str, str | None]] = set()
        self.counts: Counter[str] = Counter()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        body = b""
        if environ.get("REQUEST_METHOD") == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            import io

            environ["wsgi.input"] = io.BytesIO(body)
        form = urllib.parse.parse_qs(body.decode(errors="replace")) if body else {}
        action = (form.get("Action") or [""])[0]
        if action and EMULATOR_USER_AGENT not in environ.get("HTTP_USER_AGENT", ""):
            with self.lock:
                self.counts[action] += 1
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("AWSPriceListService."):
            # moto has no Pricing API: answer like a service that is not there, at once, not a 500 + retries
            payload = b'{"__type": "ServiceUnavailableException", "Message": "the emulator does not serve the Pricing API"}'
            start_response("400 Bad Request", [("Content-Type", "application/x-amz-json-1.1"),
                                               ("Content-Length", str(len(payload)))])  # fmt: skip
            return [payload]
        if action == "RunInstances":
            itype = (form.get("InstanceType") or [""])[0]
            zone = (form.get("Placement.AvailabilityZone") or [None])[0]
            with self.lock:
                hit = (itype, None) in self.capacity_faults or (
                    zone and (itype, zone) in self.capacity_faults
                )
            if hit:
                payload = _CAPACITY_ERROR.format(itype=itype, zone=zone or "chosen by EC2").encode()
                start_response("500 Internal Server Error", [("Content-Type", "text/xml"),
                                                             ("Content-Length", str(len(payload)))])  # fmt: skip
                return [payload]
        return self.app(environ, start_response)


class MotoServer:
    """moto's WSGI app in a thread on 127.0.0.1 with the middleware above."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        self.middleware = FaultsAndCounts(DomainDispatcherApplication(create_backend_app))
        self._serving: InThread | None = None

    def start(self) -> str:
        import logging

        from moto.moto_server.werkzeug_app import MotoRequestHandler

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns the task log
        from werkzeug.serving import make_server

        server = make_server(
            "127.0.0.1", 0, self.middleware, threaded=True, request_handler=MotoRequestHandler
        )
        self._serving = InThread(server, "moto-server")
        return self._serving.endpoint

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None


def ec2_backend(region: str) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[ACCOUNT_ID][region]


def end_instance(region: str, instance_id: str, code: str, message: str) -> None:
    """Terminate in moto with the state reason EC2 gives (spot interruption, instance shutdown)."""
    from moto.ec2.models.instances import StateReason

    backend = ec2_backend(region)
    instance = backend.get_instance(instance_id)
    if instance.state == "terminated":
        return
    backend.terminate_instances([instance_id])
    instance.state_reason = StateReason(f"{code}: {message}", code)
    instance._reason = message


def seed_public_parameters(region: str) -> None:
    """Public SSM parameters real regions have and moto lacks (the Deep Learning AMI id)."""
    from moto.ssm.models import ssm_backends

    ssm = ssm_backends[ACCOUNT_ID][region]
    cpu = ssm.get_parameter("/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    if cpu is not None and ssm.get_parameter(GPU_IMAGE_PARAM) is None:
        ssm._parameters[GPU_IMAGE_PARAM].append(cpu)  # same image: no GPU drivers matter here
