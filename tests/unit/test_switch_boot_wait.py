"""The switch to spot waits for the spot agent's first status on the one poll loop (issue 23, 29).

``lifecycle.resume.switch._await_boot`` runs between the spot launch and the on-demand stop: a
transient error is waited out (``core.engine.poll_until``), any other error turns the switch off
(the caller releases the spot launch and the on-demand attempt goes on: its own wait meets the error
if it lasts), and a kill raises ``RunKilled``. The emulator runs of the whole switch are
tests/cloud/test_leave_on_demand.py; here the cloud and the run folder are stand-ins that answer
what each case needs, and botocore's own ``ClientError`` is the error.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_cloudtrain.contract.runs import RunStatus
from airflow_cloudtrain.core.cloud import RUNNING, Instance
from airflow_cloudtrain.core.records import LaunchRecord
from airflow_cloudtrain.lifecycle.resume import switch
from airflow_cloudtrain.lifecycle.run.attempt import RunKilled

OD, SPOT = "i-ondemand", "i-spot"


def client_error(code: str, status: int) -> ClientError:
    body = {
        "Error": {"Code": code, "Message": f"{code} from the test"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(body, "GetObject")  # type: ignore[arg-type]


class Reads:
    """The spot agent's status reads: each answer in turn (an error is raised), then its first status."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, instance_id: str) -> RunStatus | None:
        assert instance_id == SPOT
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else RunStatus("running", SPOT)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


def boot_wait(spot_reads: Reads, killed: bool = False, od_status: RunStatus | None = None) -> str | None:
    running = Instance(SPOT, RUNNING, "t3.medium", "us-east-1a", True)
    cloud = SimpleNamespace(describe=lambda ids: {SPOT: running})
    loop = SimpleNamespace(
        ctx=SimpleNamespace(wait=SimpleNamespace(startup_timeout=60.0), backend=SimpleNamespace(cloud=cloud)),
        killed=killed,
        log=logging.getLogger("test_switch_boot_wait"),
    )
    od = SimpleNamespace(lease=SimpleNamespace(renew=lambda: None), status_of=lambda iid: od_status)
    spot = SimpleNamespace(status_of=spot_reads)
    od_launch = LaunchRecord("ct-0123456789ab", "s3://b/r", "ec2", "us-east-1", OD)
    launch = LaunchRecord("ct-0123456789ab", "s3://b/r", "ec2spot", "us-east-1", SPOT)
    return switch._await_boot(loop, od, od_launch, spot, launch)  # type: ignore[arg-type]


def test_a_transient_error_is_waited_out_and_the_switch_goes_on(caplog: Any) -> None:
    reads = Reads(client_error("SlowDown", 503), None)
    with caplog.at_level(logging.WARNING, "test_switch_boot_wait"):
        assert boot_wait(reads) is None  # the spot agent reported: the switch goes on
    assert reads.calls == 3
    assert "Transient error while checking the switch to spot" in caplog.text


def test_an_error_that_is_not_transient_turns_the_switch_off_at_once() -> None:
    reads = Reads(client_error("AccessDenied", 403))
    why_not = boot_wait(reads)
    assert why_not is not None and "could not check the switch to spot" in why_not
    assert "AccessDenied" in why_not
    assert reads.calls == 1  # not retried: a refusal does not pass by itself


def test_the_on_demand_job_ending_meanwhile_turns_the_switch_off() -> None:
    why_not = boot_wait(Reads(None), od_status=RunStatus("succeeded", OD, exit_code=0))
    assert why_not == "the on-demand job ended while spot booted"


def test_a_kill_during_the_wait_is_not_swallowed() -> None:
    with pytest.raises(RunKilled, match="killed during a switch to spot"):
        boot_wait(Reads(None), killed=True)
