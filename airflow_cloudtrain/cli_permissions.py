"""``cloudtrain permissions``: the least-privilege IAM policy (AWS) or custom role (Google Cloud) an
operator needs on one cloud, for the Airflow side and for its instances, as generated from the calls the
test suite's runs make (``airflow_cloudtrain.permissions``). Needs neither Airflow nor credentials.

    cloudtrain permissions --cloud ec2spot --operator CheckpointResumeOperator --side airflow
    cloudtrain permissions --cloud gcloud --operator SpotFleetOperator --format json > role.json
    cloudtrain permissions --cloud ec2spot --operator CloudTrainOperator --side instance \
        --secret aws-ssm:///team/api-token --secret airflow_conn://db/password

``--secret`` (repeatable: the values of the DAG's ``secret_env``) or ``--dag-file`` (the DAG file whose
tasks' ``secret_env`` to take; imports it, so needs Airflow) scopes the instance side's secret reads to
those secrets (``permissions.secrets``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_cloudtrain.contract.clouds import CLOUDS, provider_of

# MLEngineTrainOperator runs on Vertex AI: Google Cloud whatever the run's cloud name says
_VERTEX = "MLEngineTrainOperator"


def _scoped_to_bucket(doc: dict[str, Any], bucket: str) -> dict[str, Any]:
    """The policy with its S3 actions on ``bucket`` (and its objects) only."""
    out = json.loads(json.dumps(doc))
    for statement in out.get("Statement", []):  # the S3 actions move to a statement of their own
        statement["Action"] = [a for a in statement["Action"] if not a.startswith("s3:")]
    s3_all = sorted({a for st in doc.get("Statement", []) for a in st["Action"] if a.startswith("s3:")})
    out["Statement"] = [st for st in out["Statement"] if st["Action"]]
    if s3_all:
        out["Statement"].append(
            {
                "Sid": "RunFolderBucket",
                "Effect": "Allow",
                "Action": s3_all,
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            }
        )
    return out


def _name_of(task: Any) -> str | None:
    from airflow_cloudtrain.permissions import operator_name

    try:
        return operator_name(type(task))
    except ValueError:  # not an operator of the family
        return None


def _dag_secrets(dag_file: str, operator: str) -> list[str]:
    """The ``secret_env`` values of the file's tasks of ``operator`` (or a subclass), in DAG order;
    templated values are left out (they are only known at run time), with a note on stderr."""
    import importlib.util
    import sys

    from airflow.sdk import DAG

    from airflow_cloudtrain.operators.config import is_templated

    spec = importlib.util.spec_from_file_location("cloudtrain_permissions_dag", dag_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--dag-file {dag_file!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the DAG's own error, as the DAG processor would report it
        raise SystemExit(f"--dag-file {dag_file!r} does not import: {type(err).__name__}: {err}") from err
    dags = [value for value in vars(module).values() if isinstance(value, DAG)]
    out: list[str] = []
    for dag in dags:
        for task in dag.tasks:
            if not hasattr(task, "secret_env") or _name_of(task) != operator:
                continue
            for var, value in (task.secret_env or {}).items():
                if is_templated(value):
                    print(
                        f"# {dag.dag_id}.{task.task_id}: secret_env[{var!r}] is templated: left out",
                        file=sys.stderr,
                    )
                elif value not in out:
                    out.append(value)
    if not out:
        raise SystemExit(f"--dag-file {dag_file!r} has no {operator} task with a secret_env")
    return out


def _permissions(args: argparse.Namespace) -> int:
    from airflow_cloudtrain import permissions
    from airflow_cloudtrain.permissions import secrets

    provider = "gcp" if args.operator == _VERTEX else provider_of(args.cloud)
    refs: list[Any] = []
    named = list(args.secret or [])
    if (named or args.dag_file) and not secrets.takes_secret_env(args.operator, provider):
        raise SystemExit(f"--secret / --dag-file: {args.operator} takes no secret_env on {args.cloud}")
    if args.dag_file:
        named += [ref for ref in _dag_secrets(args.dag_file, args.operator) if ref not in named]
    if named:
        try:
            refs = secrets.parse_secrets(named, provider)
        except ValueError as err:
            raise SystemExit(str(err)) from None
    sides = [args.side] if args.side else list(permissions.SIDES)
    found: dict[str, Any] = {}
    bindings: list[dict[str, Any]] = []
    for side in sides:
        doc = permissions.document(args.operator, provider, side)
        if doc is not None and args.bucket and provider == "aws":
            doc = _scoped_to_bucket(doc, args.bucket)
        if refs and side == "instance" and provider == "aws":
            doc = secrets.scoped_aws(doc, refs)
        elif refs and side == "instance":
            scoped = secrets.scoped_gcp(doc, refs)
            doc, bindings = scoped["role"], scoped["secretBindings"]
            found["secretBindings"] = bindings
        found[side] = doc
    if args.format == "json":
        print(json.dumps(found[sides[0]] if len(found) == 1 else found, indent=2))
        return 0
    for side in sides:
        doc = found[side]
        kind = "IAM policy" if provider == "aws" else "custom role"
        where = permissions.path(args.operator, provider, side).name
        print(f"# {args.operator} on {args.cloud} ({provider}), {side} side: {kind} ({where})")
        print(json.dumps(doc, indent=2) if doc is not None else "# nothing: this side makes no API call")
    if bindings:
        print("# and, for the service account the VMs run as, on each secret (the runs' own: on the project,")
        print("# conditioned on their name; PROJECT_NUMBER: gcloud projects describe PROJECT_ID):")
        print("\n".join(secrets.binding_commands(bindings)))
    return 0


def add_permissions_parser(sub: Any) -> None:
    from airflow_cloudtrain.permissions import OPERATORS, SIDES

    parser = sub.add_parser(
        "permissions",
        help="print the least-privilege IAM policy / custom role an operator needs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cloud", required=True, choices=sorted(CLOUDS))
    parser.add_argument("--operator", required=True, choices=OPERATORS)
    parser.add_argument("--side", choices=SIDES, help="the Airflow side or the instances' (default: both)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--bucket", help="AWS: grant the S3 actions on this bucket only (default: any)")
    parser.add_argument(
        "--secret",
        action="append",
        metavar="REF",
        help="a secret_env value of the DAG (repeat for each; an SSM parameter name starting with / "
        "also works): the instances read only these secrets (default: any)",
    )
    parser.add_argument(
        "--dag-file",
        metavar="FILE",
        help="as --secret, for every secret_env value of the file's tasks of --operator (imports it)",
    )
    parser.set_defaults(func=_permissions)
