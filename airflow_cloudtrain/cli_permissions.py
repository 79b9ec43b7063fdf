"""``cloudtrain permissions``: the least-privilege IAM policy (AWS) or custom role (Google Cloud) an
operator needs on one cloud, for the Airflow side and for its instances, as generated from the calls the
test suite's runs make (``airflow_cloudtrain.permissions``). Needs neither Airflow nor credentials.

    cloudtrain permissions --cloud ec2spot --operator CheckpointResumeOperator --side airflow
    cloudtrain permissions --cloud gcloud --operator SpotFleetOperator --format json > role.json
    cloudtrain permissions --cloud ec2spot --operator CloudTrainOperator --side instance \
        --secret aws-ssm:///team/api-token --secret airflow_conn://db/password

``--secret`` (repeatable: the values of the DAG's ``secret_env``) scopes the instance side's secret
reads to those secrets (``permissions.secrets``).
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


def _permissions(args: argparse.Namespace) -> int:
    from airflow_cloudtrain import permissions
    from airflow_cloudtrain.permissions import secrets

    provider = "gcp" if args.operator == _VERTEX else provider_of(args.cloud)
    refs: list[Any] = []
    if args.secret:
        if args.operator not in secrets.WITH_SECRET_ENV:
            raise SystemExit(f"--secret: {args.operator} takes no secret_env")
        try:
            refs = secrets.parse_secrets(args.secret, provider)
        except ValueError as err:
            raise SystemExit(str(err)) from None
    sides = [args.side] if args.side else list(permissions.SIDES)
    found: dict[str, Any] = {}
    bindings: list[dict[str, str]] = []
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
        print("# and on each secret, for the service account the VMs run as:")
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
    parser.set_defaults(func=_permissions)
