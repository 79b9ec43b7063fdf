"""Our AWS hooks name the operator that made a client in the user agent (``Caller/<class>``) exactly as
the Amazon provider does, from the frames rather than ``inspect.stack()`` (``hooks.aws.CallerFromFrames``).

The user agent is what AWS's own request statistics show per caller; the provider's way of finding it
read the source line of every frame on the stack for each client a hook made."""

from __future__ import annotations

import json

import pytest
from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook
from airflow_cloudtrain.hooks.sqs import QueueDepthHook


class TrainingOperatorLike:
    """Stands for an operator: the provider looks for the innermost ``execute`` frame's ``self``."""

    def execute(self, found: dict[str, str | None]) -> None:
        self.deeper(found)

    def deeper(self, found: dict[str, str | None]) -> None:
        found["ours"] = CloudTrainAwsHook._find_operator_class_name("execute")
        found["provider"] = AwsBaseHook._find_operator_class_name("execute")
        found["ours_executor"] = CloudTrainAwsHook._find_executor_class_name()
        found["provider_executor"] = AwsBaseHook._find_executor_class_name()


class SensorLike:
    def poke(self, found: dict[str, str | None]) -> None:
        found["ours"] = QueueDepthHook._find_operator_class_name("poke")
        found["provider"] = AwsBaseHook._find_operator_class_name("poke")


def test_the_caller_is_the_operator_whose_execute_made_the_client() -> None:
    found: dict[str, str | None] = {}
    TrainingOperatorLike().execute(found)
    assert found["ours"] == found["provider"] == "TrainingOperatorLike"
    assert found["ours_executor"] == found["provider_executor"]


def test_a_sensor_is_found_by_its_poke_and_nothing_is_found_outside_one() -> None:
    found: dict[str, str | None] = {}
    SensorLike().poke(found)
    assert found["ours"] == found["provider"] == "SensorLike"
    assert CloudTrainAwsHook._find_operator_class_name("no_such_frame") is None
    assert AwsBaseHook._find_operator_class_name("no_such_frame") is None


def execute() -> str:  # a function named like the target, without ``self``: "Unknown", as the provider's
    return CloudTrainAwsHook(aws_conn_id="ct_caller")._get_caller()


def test_a_frame_without_self_gives_unknown_and_the_user_agent_names_the_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert execute() == "Unknown"
    monkeypatch.setenv("AIRFLOW_CONN_CT_CALLER", json.dumps({"conn_type": "aws"}))

    class MyTrainOperator:
        def execute(self) -> str:
            hook = CloudTrainAwsHook(aws_conn_id="ct_caller", region_name="us-east-1")
            return str(hook._get_config().user_agent_extra)

    assert "Caller/MyTrainOperator" in MyTrainOperator().execute()
