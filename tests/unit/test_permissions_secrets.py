"""``cloudtrain permissions --secret``: the instance side reads only the secrets the DAG's ``secret_env``
names (``permissions.secrets``), on AWS by ARN and on Google Cloud by per-secret bindings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain import permissions
from airflow_cloudtrain.cli import main
from airflow_cloudtrain.contract.secret_refs import parse_ref
from airflow_cloudtrain.permissions import secrets


def _reads(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Secret-reading action -> the resources a policy grants it on."""
    out: dict[str, list[str]] = {}
    for st in doc["Statement"]:
        for action in st["Action"]:
            if action in (secrets.GET_PARAMETER, secrets.GET_SECRET):
                resources = st["Resource"]
                out.setdefault(action, []).extend([resources] if isinstance(resources, str) else resources)
    return out


@pytest.mark.parametrize(
    ("reference", "name", "iam_resource"),
    [
        # a plain name (no "/") has none in its ARN either; a hierarchical one drops its leading "/".
        # An ARN is granted as given: its account (a parameter shared from another one) and partition
        (
            "arn:aws:ssm:us-east-1:123456789012:parameter/token",
            "token",
            "arn:aws:ssm:us-east-1:123456789012:parameter/token",
        ),
        (
            "arn:aws:ssm:us-east-1:123456789012:parameter/a/b",
            "/a/b",
            "arn:aws:ssm:us-east-1:123456789012:parameter/a/b",
        ),
        (
            "arn:aws-us-gov:ssm:us-gov-west-1:123456789012:parameter/a",
            "a",
            "arn:aws-us-gov:ssm:us-gov-west-1:123456789012:parameter/a",
        ),
        ("aws-ssm:///a/b", "/a/b", "arn:aws:ssm:*:*:parameter/a/b"),
        ("aws-ssm://eu-west-1/a/b", "/a/b", "arn:aws:ssm:eu-west-1:*:parameter/a/b"),
        ("aws-ssm://us-gov-east-1/a/b", "/a/b", "arn:aws-us-gov:ssm:us-gov-east-1:*:parameter/a/b"),
        ("aws-ssm://cn-north-1/a/b", "/a/b", "arn:aws-cn:ssm:cn-north-1:*:parameter/a/b"),
        ("aws-ssm:///token", "/token", "arn:aws:ssm:*:*:parameter/token"),  # "/token": its ARN is token's
        ("/a/b", "/a/b", "arn:aws:ssm:*:*:parameter/a/b"),  # --secret's bare parameter name
    ],
)
def test_an_ssm_reference_names_the_parameter_aws_does(reference: str, name: str, iam_resource: str) -> None:
    """What the agent asks SSM for (``GetParameter(Name=...)``: the ARN when given) and what the
    policy grants it on."""
    (ref,) = secrets.parse_secrets([reference], "aws")
    assert (ref.scheme, ref.name) == ("aws-ssm", name)
    assert ref.arn == (reference if reference.startswith("arn:") else "")
    assert secrets.parameter_arn(ref) == iam_resource


def test_a_secrets_manager_name_is_granted_in_its_region_s_partition() -> None:
    (ref,) = secrets.parse_secrets(["aws-secretsmanager://cn-northwest-1/prod/db"], "aws")
    assert secrets.secret_arn(ref) == "arn:aws-cn:secretsmanager:cn-northwest-1:*:secret:prod/db-??????"


@pytest.mark.parametrize(
    "reference",
    [
        "arn:aws:ssm:us-east-1:123456789012:parameter",  # no name
        "arn:aws:ssm:us-east-1:123456789012:parametertoken",
        "arn:aws:ssm:us-east-1:123456789012:parameter//a",
    ],
)
def test_a_malformed_ssm_arn_is_no_reference(reference: str) -> None:
    assert parse_ref(reference) is None


def test_aws_reads_only_the_named_parameters_and_secrets() -> None:
    generated = permissions.document("CloudTrainOperator", "aws", "instance")
    assert _reads(generated or {}) == {  # the default: any parameter, any secret
        "ssm:GetParameter": ["arn:aws:ssm:*:*:parameter/*"],
        "secretsmanager:GetSecretValue": ["arn:aws:secretsmanager:*:*:secret:*"],
    }
    refs = secrets.parse_secrets(
        [
            "aws-ssm:///team/api-token",
            "arn:aws:ssm:eu-west-1:123456789012:parameter/prod/db",
            "/bare/name",
            "aws-secretsmanager://us-east-2/prod/creds#password",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:x-AbCdEf",
        ],
        "aws",
    )
    scoped = secrets.scoped_aws(generated, refs)
    assert _reads(scoped) == {
        "ssm:GetParameter": [
            "arn:aws:ssm:*:*:parameter/bare/name",
            "arn:aws:ssm:*:*:parameter/team/api-token",
            "arn:aws:ssm:eu-west-1:123456789012:parameter/prod/db",  # its account kept
        ],
        "secretsmanager:GetSecretValue": [
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:x-AbCdEf",
            "arn:aws:secretsmanager:us-east-2:*:secret:prod/creds-??????",
        ],
    }
    # everything else is as generated
    assert permissions.granted(scoped) == permissions.granted(generated)


def test_an_airflow_reference_adds_the_runs_own_parameters_and_no_ssm_reference_reads_none() -> None:
    generated = permissions.document("SpotFleetOperator", "aws", "instance")
    only_vars = secrets.scoped_aws(generated, secrets.parse_secrets(["airflow_var://token"], "aws"))
    assert _reads(only_vars) == {"ssm:GetParameter": ["arn:aws:ssm:*:*:parameter/cloudtrain/*"]}
    only_sm = secrets.scoped_aws(generated, secrets.parse_secrets(["aws-secretsmanager:///db"], "aws"))
    assert secrets.GET_PARAMETER not in permissions.granted(only_sm)
    # an operator whose generated instance document reads no parameter still gets the named ones
    none = secrets.scoped_aws(None, secrets.parse_secrets(["/p"], "aws"))
    assert _reads(none) == {"ssm:GetParameter": ["arn:aws:ssm:*:*:parameter/p"]}


def test_gcp_moves_the_secret_read_from_the_role_to_the_secrets() -> None:
    role = permissions.document("CloudTrainOperator", "gcp", "instance")
    assert role is not None and secrets.ACCESS_VERSION in role["includedPermissions"]
    refs = secrets.parse_secrets(
        ["gcp-secret://projects/proj-1/secrets/token", "projects/proj-2/secrets/key/versions/3"], "gcp"
    )
    scoped = secrets.scoped_gcp(role, refs)
    assert secrets.ACCESS_VERSION not in scoped["role"]["includedPermissions"]
    assert set(scoped["role"]["includedPermissions"]) == set(role["includedPermissions"]) - {
        secrets.ACCESS_VERSION
    }
    assert scoped["secretBindings"] == [
        {"secret": "projects/proj-1/secrets/token", "role": "roles/secretmanager.secretAccessor"},
        {"secret": "projects/proj-2/secrets/key", "role": "roles/secretmanager.secretAccessor"},
    ]
    assert secrets.binding_commands(scoped["secretBindings"])[1] == (
        "gcloud secrets add-iam-policy-binding key --project proj-2 --member serviceAccount:SA_EMAIL "
        "--role roles/secretmanager.secretAccessor"
    )


def test_gcp_reads_the_runs_own_secrets_by_their_name_prefix() -> None:
    """A run's own secret (an ``airflow_*`` reference) is named per run, so no binding on a secret can be
    made in advance: the project binding's condition admits the names the product gives them, and only
    those; the role keeps no project-wide read."""
    from types import SimpleNamespace

    from airflow_cloudtrain.clouds.gcp.secrets import secret_name

    role = permissions.document("PreemptibleGroupOperator", "gcp", "instance")
    refs = secrets.parse_secrets(
        ["airflow_conn://db/password", "gcp-secret://projects/proj-1/secrets/t"], "gcp"
    )
    scoped = secrets.scoped_gcp(role, refs)
    assert secrets.ACCESS_VERSION not in scoped["role"]["includedPermissions"]
    (on_secret, on_project) = scoped["secretBindings"]
    assert on_secret == {"secret": "projects/proj-1/secrets/t", "role": secrets.ACCESSOR_ROLE}
    expression = 'resource.name.startsWith("projects/PROJECT_NUMBER/secrets/cloudtrain-")'
    assert on_project == {
        "project": "PROJECT_ID",
        "role": secrets.ACCESSOR_ROLE,
        "condition": {"title": "cloudtrain-run-secrets", "expression": expression},
    }
    prefix = expression.split('"')[1].replace("PROJECT_NUMBER", "123456789")
    # IAM evaluates names with the project's number: what the product names a run's secret, there
    backend: Any = SimpleNamespace(hook=SimpleNamespace(project="123456789"))
    run_secret = secret_name(backend, "d1g3st", "DB_PASSWORD")
    assert f"{run_secret}/versions/latest".startswith(prefix)
    assert not "projects/123456789/secrets/team-token".startswith(prefix)
    assert secrets.binding_commands([on_project]) == [
        "gcloud projects add-iam-policy-binding PROJECT_ID --member serviceAccount:SA_EMAIL "
        f"--role roles/secretmanager.secretAccessor --condition='expression={expression},"
        "title=cloudtrain-run-secrets'"
    ]


@pytest.mark.parametrize(
    ("value", "provider", "words"),
    [
        ("hunter2", "aws", "--secret 'hunter2' is not valid: give a secret_env reference"),
        ("aws-ssm:///x", "gcp", "names a secret on AWS but the operator's instances run on GCP"),
        ("gcp-secret://projects/proj-1/secrets/s", "aws", "names a secret on GCP"),
    ],
)
def test_a_bad_secret_is_named(value: str, provider: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        secrets.parse_secrets([value], provider)


def test_the_cli_scopes_the_instance_side(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["permissions", "--cloud", "ec2spot", "--operator", "CheckpointResumeOperator"]
    assert main([*argv, "--format", "json", "--secret", "aws-ssm:///team/api-token"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["airflow"] == permissions.document("CheckpointResumeOperator", "aws", "airflow")
    assert _reads(both["instance"]) == {"ssm:GetParameter": ["arn:aws:ssm:*:*:parameter/team/api-token"]}
    gcp = ["permissions", "--cloud", "gcspot", "--operator", "PreemptibleGroupOperator", "--side", "instance"]
    assert main([*gcp, "--secret", "gcp-secret://projects/proj-1/secrets/token"]) == 0
    text = capsys.readouterr().out
    assert "secretmanager.versions.access" not in text
    assert "gcloud secrets add-iam-policy-binding token --project proj-1" in text
    with pytest.raises(SystemExit, match="MLEngineTrainOperator takes no secret_env"):
        main(["permissions", "--cloud", "gcspot", "--operator", "MLEngineTrainOperator", "--secret", "/x"])
    with pytest.raises(SystemExit, match="--secret 'plain' is not valid"):
        main([*argv, "--secret", "plain"])


DAG_FILE = """
from airflow.sdk import DAG
from airflow_cloudtrain.operators import CheckpointResumeOperator, CloudTrainOperator

with DAG("secrets_dag", schedule=None) as dag:
    CloudTrainOperator(
        task_id="train", cloud="ec2", instance_type="t3.medium", command="x", bucket="s3://my-runs",
        secret_env={"TOKEN": "aws-ssm:///team/token", "DB": "airflow_conn://db/password",
                    "LATER": "{{ var.value.ref }}"},
    )
    CheckpointResumeOperator(
        task_id="resume", cloud="ec2", instance_type="t3.medium", command="x", bucket="s3://my-runs",
        secret_env={"OTHER": "aws-ssm:///resume/only"},
    )
"""


def test_the_cli_takes_the_secrets_from_a_dag_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file's CloudTrainOperator tasks' secret_env (not its CheckpointResumeOperator's, which has
    its own documents), templated values left out with a note."""
    dag_file = tmp_path / "secrets_dag.py"
    dag_file.write_text(DAG_FILE)
    argv = ["permissions", "--cloud", "ec2", "--operator", "CloudTrainOperator", "--side", "instance"]
    assert main([*argv, "--format", "json", "--dag-file", str(dag_file)]) == 0
    out = capsys.readouterr()
    policy = out.out[out.out.index("{\n") :]  # after any line Airflow's test config logs on import
    assert _reads(json.loads(policy)) == {
        "ssm:GetParameter": [
            "arn:aws:ssm:*:*:parameter/cloudtrain/*",
            "arn:aws:ssm:*:*:parameter/team/token",
        ]
    }
    assert "secrets_dag.train: secret_env['LATER'] is templated: left out" in out.err
    with pytest.raises(SystemExit, match="has no SpotFleetOperator task with a secret_env"):
        main([*argv[:4], "SpotFleetOperator", "--dag-file", str(dag_file)])
    broken = tmp_path / "broken.py"
    broken.write_text(DAG_FILE.replace("s3://my-runs", "s3://b"))
    with pytest.raises(SystemExit, match="does not import: ValueError: bucket='s3://b' is not valid"):
        main([*argv, "--dag-file", str(broken)])
