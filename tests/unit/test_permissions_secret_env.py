"""Every operator that takes ``secret_env`` gets the secret calls in its default documents, whatever its
own tests' recorded runs read: its instances read every scheme the agent reads
(``permissions.secret_calls``), its Airflow side stores the run's own copies of ``airflow_*`` values;
an operator without ``secret_env`` reads no secret."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cloudtrain import permissions
from airflow_cloudtrain.cli import main
from airflow_cloudtrain.permissions import secret_calls, secrets

# what each operator's secret_env needs its instances to read, per provider it runs on: the agent reads
# SSM parameters and Secrets Manager secrets on AWS, Secret Manager versions on Google Cloud
READS = {
    "aws": {"ssm:GetParameter", "secretsmanager:GetSecretValue"},
    "gcp": {"secretmanager.versions.access"},
}
TAKES = {
    "CheckpointResumeOperator": {"aws", "gcp"},
    "CloudTrainOperator": {"aws", "gcp"},
    "SpotFleetOperator": {"aws"},
    "PreemptibleGroupOperator": {"gcp"},
}
INSTANCE_DOCUMENTS = sorted(
    (operator, provider)
    for operator in permissions.OPERATORS
    for provider in permissions.PROVIDERS
    if permissions.path(operator, provider, "instance").exists()
)


def _secret_grants(doc: dict[str, Any] | None) -> set[str]:
    """The secret-store permissions a document grants (reads, writes, lists: any)."""
    stores = ("ssm:", "secretsmanager:", "secretmanager.")
    return {p for p in permissions.granted(doc) if p.startswith(stores)}


def _resources(doc: dict[str, Any], action: str) -> list[Any]:
    return [st["Resource"] for st in doc["Statement"] if action in st["Action"]]


def test_the_operators_that_take_secret_env_come_from_their_signatures() -> None:
    assert secret_calls.secret_env_operators() == TAKES

    from airflow_cloudtrain.operators import CloudTrainOperator, MLEngineTrainOperator

    class Subclass(CloudTrainOperator):  # a user's subclass passes secret_env on through **kwargs
        def __init__(self, *, extra: int = 0, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    class Closed(CloudTrainOperator):  # one that names its arguments takes only those
        def __init__(self, *, command: str, bucket: str) -> None:
            super().__init__(command=command, bucket=bucket)

    assert secret_calls.takes(Subclass, "secret_env")
    assert not secret_calls.takes(Closed, "secret_env")
    assert not secret_calls.takes(MLEngineTrainOperator, "secret_env")


@pytest.mark.parametrize(("operator", "provider"), INSTANCE_DOCUMENTS)
def test_each_instance_document_reads_what_secret_env_needs_and_no_more(operator: str, provider: str) -> None:
    """A secret_env operator's instances may read any parameter / secret (the user's references are
    unknown here: ``--secret`` narrows them) with nothing else of the stores; other operators' none."""
    doc = permissions.document(operator, provider, "instance")
    assert doc is not None
    needs = READS[provider] if provider in TAKES.get(operator, set()) else set()
    assert _secret_grants(doc) == needs
    assert secrets.takes_secret_env(operator, provider) == bool(needs)
    if provider == "aws" and needs:
        assert _resources(doc, "ssm:GetParameter") == [["arn:aws:ssm:*:*:parameter/*"]]
        assert _resources(doc, "secretsmanager:GetSecretValue") == [["arn:aws:secretsmanager:*:*:secret:*"]]


@pytest.mark.parametrize(
    ("operator", "provider", "stores"),
    [
        (
            "CheckpointResumeOperator",
            "aws",
            {"ssm:PutParameter", "ssm:DeleteParameters", "ssm:DescribeParameters"},
        ),
        ("SpotFleetOperator", "aws", {"ssm:PutParameter", "ssm:DeleteParameters", "ssm:DescribeParameters"}),
        (
            "CheckpointResumeOperator",
            "gcp",
            {
                "secretmanager.secrets.create",
                "secretmanager.versions.add",
                "secretmanager.secrets.list",
                "secretmanager.secrets.delete",
            },
        ),
    ],
)
def test_the_airflow_side_stores_the_runs_own_secrets(operator: str, provider: str, stores: set[str]) -> None:
    """An ``airflow_*`` reference is stored as a secret of the run (``clouds.*.secrets``) by any secret_env
    operator, and deleted at its teardown; on AWS only under ``/cloudtrain/``."""
    doc = permissions.document(operator, provider, "airflow")
    assert stores <= permissions.granted(doc)
    if provider == "aws":
        assert doc is not None
        for action in ("ssm:PutParameter", "ssm:DeleteParameters"):
            assert _resources(doc, action) == [["arn:aws:ssm:*:*:parameter/cloudtrain/*"]]


def test_secret_calls_match_what_the_secrets_tests_recorded() -> None:
    """The tables ``secret_calls`` adds from are what ``CloudTrainOperator``'s recorded runs (the
    secrets tests) called of the stores: nothing of theirs is missing from the tables."""
    from airflow_cloudtrain.permissions.generate import load_record

    airflow_side_ami_lookup = ("aws", "ssm", "GetParameter")
    for row in load_record():
        call = (row["provider"], row["service"], row["operation"])
        if row["operator"] != "CloudTrainOperator" or row["service"] not in ("ssm", "secretmanager"):
            continue
        if row["side"] == "instance":
            assert (row["service"], row["operation"]) in secret_calls.reads(row["provider"]), row
        elif call != airflow_side_ami_lookup:
            assert (row["service"], row["operation"]) in secret_calls.stores(row["provider"]), row


def test_the_cli_scopes_any_secret_env_operator_and_refuses_the_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "permissions",
        "--cloud",
        "gcspot",
        "--operator",
        "CheckpointResumeOperator",
        "--side",
        "instance",
    ]
    assert main([*argv, "--secret", "gcp-secret://projects/proj-1/secrets/token"]) == 0
    text = capsys.readouterr().out
    assert "secretmanager.versions.access" not in text and "add-iam-policy-binding token" in text
    with pytest.raises(SystemExit, match="SpotFleetOperator takes no secret_env"):
        main(["permissions", "--cloud", "gcspot", "--operator", "SpotFleetOperator", "--secret", "/x"])
