"""QueueDepthSensor against SQS on the emulator, what only SQS has: parse-time checks, queue names and
URLs, in-flight and delayed messages, missing queues, a trigger's serialization. What SQS and Pub/Sub
share (drains, fills, throttling, one read per poll across deferred sensors, a deferrable run in a
DAG) is ``test_queue_depth.py``, on both."""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import re
import uuid
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import boto3
import pytest

from airflow_cloudtrain.sensors import QueueDepthSensor
from airflow_cloudtrain.triggers import queue_depth, shared_poll
from airflow_cloudtrain.triggers.queue_depth import QueueDepthTrigger

UNCLOSED = "Unclosed client session"


@pytest.fixture
def sqs(emu) -> Any:
    return boto3.client("sqs")


@pytest.fixture
def queue(sqs) -> Iterator[tuple[str, str]]:
    """(name, url) of a fresh queue, deleted afterwards."""
    name = f"ct-q-{uuid.uuid4().hex[:10]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    yield name, url
    sqs.delete_queue(QueueUrl=url)


def send(sqs, url: str, n: int) -> None:
    for i in range(n):
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"item": i}))


def sensor(**kwargs: Any) -> QueueDepthSensor:
    kwargs.setdefault("poll_interval", 0.2)
    kwargs.setdefault("timeout", 30)
    kwargs.setdefault("deferrable", False)
    return QueueDepthSensor(task_id=f"wait_{uuid.uuid4().hex[:6]}", **kwargs)


# --- parse time ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"queue": "q"}, "give max_depth=N (succeed when the depth is <= N"),
        ({"queue": "q", "max_depth": 0, "min_depth": 2}, "max_depth=0 and min_depth=2"),
        ({"queue": "q", "max_depth": -1}, "max_depth=-1"),
        ({"queue": "q", "min_depth": "3"}, "min_depth='3'"),
        ({"queue": "q", "max_depth": True}, "max_depth=True"),
        ({"queue": "q", "max_depth": 0, "poll_interval": 0}, "poll_interval=0"),
        ({"queue": "q", "max_depth": 0, "poll_interval": "fast"}, "poll_interval='fast'"),
        ({"queue": "q", "max_depth": 0, "count_in_flight": "yes"}, "count_in_flight='yes'"),
        ({"queue": "", "max_depth": 0}, "queue=''"),
        ({"queue": None, "max_depth": 0}, "queue=None"),
        ({"queue": "  ", "max_depth": 0}, "queue='  '"),
        ({"queue": "projects/p/topics/t", "max_depth": 0}, "queue='projects/p/topics/t' is a Pub/Sub topic"),
        ({"queue": "my/queue", "max_depth": 0}, "queue='my/queue' is not valid"),
        ({"queue": "https://sqs.us-east-1.amazonaws.com", "max_depth": 0}, "is not a queue URL"),
    ],
)
def test_bad_arguments_fail_at_parse_time_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        QueueDepthSensor(task_id="s", **kwargs)


def test_accepted_queue_forms() -> None:
    for q in (
        "jobs",
        "jobs.fifo",
        "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs",
        "projects/p/subscriptions/s",
        "{{ params.queue }}",
    ):
        assert QueueDepthSensor(task_id="s", queue=q, max_depth=0).watched_queue == q
    s = QueueDepthSensor(task_id="s", queue="jobs", min_depth=5, poll_interval=7)
    assert (s.min_depth, s.max_depth, s.count_in_flight, s.poke_interval) == (5, None, True, 7)


def test_the_executor_queue_is_not_the_watched_queue() -> None:
    """BaseOperator's ``queue`` routes the task to workers; it must not become the SQS queue."""
    from airflow.sdk.bases.operator import DEFAULT_QUEUE

    s = QueueDepthSensor(task_id="s", queue="jobs", max_depth=0)
    assert (s.watched_queue, s.queue) == ("jobs", DEFAULT_QUEUE)
    routed = QueueDepthSensor(task_id="s", queue="jobs", max_depth=0, executor_queue="gpu")
    assert (routed.watched_queue, routed.queue) == ("jobs", "gpu")


def test_depth_and_decision_are_pure() -> None:
    from airflow_cloudtrain.hooks.depth import QueueDepth
    from airflow_cloudtrain.hooks.sqs import region_in_url
    from airflow_cloudtrain.triggers.queue_depth import evaluate_depth

    d = QueueDepth("u", visible=2, in_flight=3, delayed=1)
    assert (d.depth(), d.depth(count_in_flight=False)) == (6, 2)
    assert evaluate_depth(d, max_depth=5, min_depth=None) is None
    assert evaluate_depth(d, max_depth=2, min_depth=None, count_in_flight=False)["status"] == "success"
    assert evaluate_depth(d, max_depth=None, min_depth=6)["depth"] == 6
    gone = evaluate_depth(QueueDepth("u", missing=True), max_depth=None, min_depth=0)
    assert gone["status"] == "error" and "queue u does not exist" in gone["message"]
    assert region_in_url("https://sqs.eu-west-1.amazonaws.com/1/q") == "eu-west-1"
    assert region_in_url("https://us-west-2.queue.amazonaws.com/1/q") == "us-west-2"
    assert region_in_url("http://127.0.0.1:5000/1/q") is None


# --- poking (non-deferrable) ---------------------------------------------------------------------


def test_count_in_flight_false_ignores_in_flight_messages(sqs, queue) -> None:
    _, url = queue
    send(sqs, url, 2)
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=600)
    assert len(received["Messages"]) == 1
    assert not sensor(queue=url, max_depth=1).poke({})  # 1 visible + 1 in flight
    visible_only = sensor(queue=url, max_depth=1, count_in_flight=False).execute({})
    assert visible_only == {"queue": url, "depth": 1, "visible": 1, "in_flight": 1, "delayed": 0}


def test_delayed_messages_count_with_in_flight(sqs, queue) -> None:
    _, url = queue
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=600)
    done = sensor(queue=url, max_depth=0, count_in_flight=False).poke({})
    assert done and done.xcom_value["delayed"] == 1 and done.xcom_value["depth"] == 0
    assert not sensor(queue=url, max_depth=0).poke({})


def test_a_missing_queue_fails_naming_it(emu, sqs) -> None:
    ghost = f"ct-ghost-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=f"SQS queue '{ghost}' does not exist"):
        sensor(queue=ghost, max_depth=0).execute({})
    ghost_url = f"{emu.aws_endpoint}/123456789012/{ghost}"
    for threshold in ({"max_depth": 0}, {"min_depth": 1}):
        with pytest.raises(Exception, match=f"queue {ghost_url} does not exist"):
            sensor(queue=ghost_url, **threshold).execute({})


# --- the trigger ---------------------------------------------------------------------------------


def trigger(url: str, **kwargs: Any) -> QueueDepthTrigger:
    kwargs.setdefault("max_depth", 0)
    kwargs.setdefault("poll_interval", 0.3)
    return QueueDepthTrigger(queue=url, conn_id="aws_default", **kwargs)


async def first_event(t: QueueDepthTrigger) -> dict[str, Any]:
    async with aclosing(t.run()) as events:
        async for event in events:
            return event.payload
    raise AssertionError("the trigger ended without an event")


def assert_clean(capfd, caplog) -> None:
    """No client left open: the registries are empty and aiohttp complained about nothing."""
    gc.collect()
    assert not queue_depth._readers
    assert not [k for k in shared_poll._groups if isinstance(k, tuple) and k[:1] == ("sqs",)]
    captured = capfd.readouterr()
    assert UNCLOSED not in captured.out + captured.err + caplog.text


def test_trigger_fails_at_once_on_a_missing_queue(emu, capfd, caplog) -> None:
    ghost_url = f"{emu.aws_endpoint}/123456789012/ct-ghost-{uuid.uuid4().hex[:8]}"
    event = asyncio.run(asyncio.wait_for(first_event(trigger(ghost_url, min_depth=1, max_depth=None)), 120))
    assert event["status"] == "error" and f"queue {ghost_url} does not exist" in event["message"]
    assert_clean(capfd, caplog)


def test_trigger_serialize_round_trips() -> None:
    t = QueueDepthTrigger(
        queue="https://sqs.eu-west-1.amazonaws.com/123456789012/jobs",
        min_depth=5,
        count_in_flight=False,
        conn_id="aws_prod",
        region="eu-west-1",
        poll_interval=12.5,
    )
    classpath, kwargs = t.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain JSON only
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["min_depth"] == 5 and kwargs["max_depth"] is None and kwargs["count_in_flight"] is False
