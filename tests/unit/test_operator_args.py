"""Bad operator arguments fail when the DAG file is parsed, naming the field; no network is used."""

from __future__ import annotations

import socket

import pytest

from airflow_cloudtrain.catalog import NoOfferError
from airflow_cloudtrain.catalog import select as select_mod
from airflow_cloudtrain.operators import CloudTrainOperator


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse time must not touch the network: any connection attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("network used at DAG parse time")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def make(**kw):
    args = {"task_id": "t", "command": "python train.py", "bucket": "s3://bkt/p", "cloud": "ec2"}
    return CloudTrainOperator(**{**args, **kw})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cloud": "azure"}, "cloud='azure' is not supported"),
        ({"ram": "12q"}, "ram='12q' is not a valid size"),
        ({"cpus": 0}, "cpus=0 is not valid"),
        ({"gpus": -1}, "gpus=-1 is not valid"),
        ({"hdd": "tiny"}, "hdd='tiny'"),
        ({"bid": "abc"}, "bid='abc' is not valid"),
        ({"bucket": "gs://bkt/p"}, "bucket='gs://bkt/p' is not valid for cloud='ec2': use a s3:// URI"),
        ({"cloud": "gcloud", "bucket": "s3://bkt"}, "use a gs:// URI"),
        ({"command": ""}, "command='' is not valid"),
        ({"max_runtime": "soon"}, "max_runtime='soon' is not a valid duration"),
        ({"env": {"1BAD": "x"}}, "env is not valid"),
        ({"provisioning": "cheap"}, "provisioning='cheap' is not valid"),
        ({"cpus": 500}, "cpus=500 is more than any ec2 offer has: the largest, c7i.48xlarge, has 192 vCPUs"),
        ({"gpus": 9}, "gpus=9 is more than any ec2 offer has"),
        ({"ram": "3000g"}, "ram='3000g' is more than any ec2 offer has"),
    ],
)
def test_bad_input_fails_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        make(**kwargs)


def test_gce_request_no_machine_can_serve_names_the_largest_offers() -> None:
    # each value alone is beyond every offer: the field is named
    with pytest.raises(ValueError, match=r"gpus=16 is more than any gcloud offer has.*use at most 8"):
        make(cloud="gcloud", bucket="gs://bkt/p", cpus=8, gpus=16)
    with pytest.raises(ValueError, match=r"ram='3000g' is more than any gcspot offer has"):
        make(cloud="gcspot", bucket="gs://bkt/p", cpus=4, ram="3000g")
    # each within some offer, no offer has them together: the largest offers, and why no family can
    with pytest.raises(NoOfferError) as err:
        make(cloud="gcloud", bucket="gs://bkt/p", cpus=200, gpus=1, gpu_type="L4")
    assert "Largest offers" in str(err.value) and "a3-highgpu-8g" in str(err.value)
    assert "No GCE family can serve it" in str(err.value)


def test_templated_values_are_checked_when_the_task_runs() -> None:
    op = make(cpus="{{ params.cpus }}", ram="{{ params.ram }}", cloud="{{ params.cloud }}")
    assert op.cpus == "{{ params.cpus }}"  # accepted now, validated after rendering


def test_bid_on_gcspot_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen where the catalog module warns, not through the process's warning filters: those are one
    global state, and a thread an earlier test left running (a ``catch_warnings`` entered or left
    there) could change them under ``pytest.warns`` (it once saw no warning beside another suite)."""
    import types

    said: list[tuple[str, type[Warning]]] = []
    recorder = types.SimpleNamespace(
        warn=lambda message, category, stacklevel=1: said.append((message, category))
    )
    monkeypatch.setattr(select_mod, "_warned_gcspot_bid", False)
    monkeypatch.setattr(select_mod, "warnings", recorder)
    make(cloud="gcspot", bucket="gs://bkt/p", bid="60%")
    make(cloud="gcspot", bucket="gs://bkt/p", bid="60%", task_id="t2")
    assert len(said) == 1 and said[0][1] is UserWarning, said
    assert "bid='60%' has no effect on cloud='gcspot'" in said[0][0]


def test_importing_an_operator_costs_no_cloud_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys; before = set(sys.modules)\n"
        "from airflow_cloudtrain.operators import CloudTrainOperator\n"
        "CloudTrainOperator(task_id='t', command='x', bucket='s3://bkt', cloud='ec2spot', cpus=4, ram='8g')\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(('boto', 'google.cloud'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
