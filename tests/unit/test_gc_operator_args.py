"""``CloudTrainGcOperator``'s bad input is refused when the DAG is parsed, naming the field, the value
and the accepted forms; ``cloudtrain gc --older-than`` takes the same forms."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_cloudtrain.operators import CloudTrainGcOperator


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"cloud": "azure"}, ["cloud='azure'", "aws", "gcloud"]),
        ({"cloud": "aws", "older_than": "soon"}, ["older_than='soon'", "1h30m", "or 0"]),
        ({"cloud": "aws", "older_than": -5}, ["older_than=-5"]),
        ({"cloud": "aws", "bucket": "my-bucket"}, ["bucket='my-bucket'", "s3://"]),
    ],
)
def test_bad_arguments_are_refused_at_parse_time(kwargs: dict[str, object], words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        CloudTrainGcOperator(task_id="gc", **kwargs)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1h", 3600.0), ("90m", 5400.0), (0, 0.0), ("0", 0.0), (timedelta(days=2), 172800.0)],
)
def test_older_than_takes_the_operators_durations_and_zero(value: object, seconds: float) -> None:
    op = CloudTrainGcOperator(task_id="gc", cloud="gcloud", older_than=value)
    assert op.older_than_s == seconds and op.gc_dry_run is False
