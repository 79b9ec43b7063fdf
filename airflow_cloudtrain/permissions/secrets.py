"""The secret reads of a document, scoped to the secrets a DAG names (``cloudtrain permissions
--secret REF``).

``secret_env`` references are read on the instance with its own identity (``agent.secrets``): an
SSM parameter (``ssm:GetParameter``), a Secrets Manager secret (``secretsmanager:GetSecretValue``) or a
Secret Manager version (``secretmanager.versions.access``). The generated instance-side documents of
every operator that takes ``secret_env`` grant those reads on every secret (``secret_calls``), since
the generator cannot know a user's names. Given the DAG's references
(the same strings as its ``secret_env`` values), this rewrites the instance side to read only them:

* AWS: ``ssm:GetParameter`` on ``arn:aws:ssm:<region|*>:*:parameter/<name>`` for each parameter, and
  on the runs' own ``parameter/cloudtrain/*`` when an ``airflow_conn://``/``airflow_var://`` reference
  is among them (the operator stores its value there for the agent); ``secretsmanager:GetSecretValue``
  on each secret's ARN (a name gets the ``-??????`` suffix AWS appends);
* Google Cloud: a custom role cannot name resources, so ``secretmanager.versions.access`` leaves the
  role and is granted on each secret instead (``roles/secretmanager.secretAccessor`` bound on the
  secret); the runs' own secrets (an ``airflow_*`` reference: ``cloudtrain-<run key>-<VAR>``, named
  per run, so no binding on a secret can be made before the run) get the same role bound on the
  project with an IAM condition on the name prefix the product controls
  (``resource.name.startsWith("projects/PROJECT_NUMBER/secrets/cloudtrain-")``: IAM names secrets
  by the project's number).

The Airflow side reads no ``secret_env`` secret (the operator only writes the runs' own, already
scoped to them), so it is left as generated. Stdlib only, as the rest of ``permissions``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_cloudtrain.contract.secret_refs import (
    AWS_SECRETSMANAGER,
    AWS_SSM,
    FORMS,
    GCP_SECRET,
    SecretRef,
    parse_ref,
    ssm_arn_resource,
)
from airflow_cloudtrain.permissions import document, granted
from airflow_cloudtrain.permissions.actions import permissions_for
from airflow_cloudtrain.permissions.rules import PARAMETERS, SECRET_PARAMETERS_SID, SECRETS_SID

GET_PARAMETER, GET_SECRET = "ssm:GetParameter", "secretsmanager:GetSecretValue"
ACCESS_VERSION, ACCESSOR_ROLE = "secretmanager.versions.access", "roles/secretmanager.secretAccessor"


def reading(provider: str) -> set[str]:
    """The permissions of the agent's secret reads on ``provider`` (``agent.secrets.READS``)."""
    from airflow_cloudtrain.agent.secrets import READS

    return {
        p
        for cloud, service, op in READS.values()
        if cloud == provider
        for p in permissions_for(cloud, service, op)
    }


def takes_secret_env(operator: str, provider: str) -> bool:
    """Does ``operator`` take ``secret_env`` (on ``provider``)? Exactly then its generated instance
    document has the agent's secret reads (``secret_calls`` takes that from the operators'
    signatures), so the command line asks the documents and needs no Airflow."""
    return reading(provider) <= granted(document(operator, provider, "instance"))


def parse_secrets(texts: Iterable[str], provider: str) -> list[SecretRef]:
    """``--secret`` values: secret references of ``provider``'s cloud (or ``airflow_*``), or a bare
    SSM parameter name (``/team/token``). ValueError naming the value."""
    out: list[SecretRef] = []
    for text in texts:
        ref = parse_ref(f"aws-ssm://{text}" if text.startswith("/") else text)
        if ref is None:
            raise ValueError(
                f"--secret {text!r} is not valid: give a secret_env reference, {FORMS}, or an SSM "
                "parameter name starting with /"
            )
        if ref.cloud and ref.cloud != provider:
            raise ValueError(
                f"--secret {text!r} names a secret on {ref.cloud.upper()} but the operator's instances run on "
                f"{provider.upper()}, where they cannot read it"
            )
        out.append(ref)
    return out


def partition(region: str) -> str:
    """The ARN partition of an AWS region: GovCloud's and China's regions have their own."""
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    if region.startswith("cn-"):
        return "aws-cn"
    return "aws"


def parameter_arn(ref: SecretRef) -> str:
    """An SSM parameter's ARN as IAM names it: as given (its account and partition kept), or from its
    name (``contract.secret_refs.ssm_arn_resource``) in any account of the region's partition."""
    if ref.arn:
        return ref.arn
    return f"arn:{partition(ref.region)}:ssm:{ref.region or '*'}:*:{ssm_arn_resource(ref.name)}"


def secret_arn(ref: SecretRef) -> str:
    """A Secrets Manager secret's ARN: as given, or from its name with AWS's random suffix."""
    if ref.name.startswith("arn:"):
        return ref.name
    return f"arn:{partition(ref.region)}:secretsmanager:{ref.region or '*'}:*:secret:{ref.name}-??????"


def secret_of(ref: SecretRef) -> str:
    """The Secret Manager secret (``projects/P/secrets/S``) of a version reference."""
    return ref.name.split("/versions/")[0]


def _by_operator(refs: list[SecretRef]) -> bool:
    return any(ref.by_operator for ref in refs)


def scoped_aws(doc: Mapping[str, Any] | None, refs: list[SecretRef]) -> dict[str, Any]:
    """An instance-side IAM policy that reads only the named parameters and secrets."""
    out: dict[str, Any] = json.loads(json.dumps(doc or {"Version": "2012-10-17", "Statement": []}))
    for statement in out["Statement"]:
        statement["Action"] = [a for a in statement["Action"] if a not in (GET_PARAMETER, GET_SECRET)]
    out["Statement"] = [st for st in out["Statement"] if st["Action"]]
    parameters = [parameter_arn(r) for r in refs if r.scheme == AWS_SSM]
    parameters += [PARAMETERS] if _by_operator(refs) else []
    if parameters:
        out["Statement"].append(_allow(SECRET_PARAMETERS_SID, GET_PARAMETER, parameters))
    secrets = [secret_arn(r) for r in refs if r.scheme == AWS_SECRETSMANAGER]
    if secrets:
        out["Statement"].append(_allow(SECRETS_SID, GET_SECRET, secrets))
    return out


def _allow(sid: str, action: str, resources: list[str]) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": [action], "Resource": sorted(set(resources))}


def run_secrets_binding(project: str = "PROJECT_ID", number: str = "PROJECT_NUMBER") -> dict[str, Any]:
    """The project binding that reads the runs' own secrets only (``clouds.gcp.secrets.ID_PREFIX``)."""
    from airflow_cloudtrain.clouds.gcp.secrets import ID_PREFIX

    expression = f'resource.name.startsWith("projects/{number}/secrets/{ID_PREFIX}")'
    condition = {"title": "cloudtrain-run-secrets", "expression": expression}
    return {"project": project, "role": ACCESSOR_ROLE, "condition": condition}


def scoped_gcp(role: Mapping[str, Any] | None, refs: list[SecretRef]) -> dict[str, Any]:
    """``{"role": ..., "secretBindings": [...]}``: the instance side's custom role without the
    project-wide secret read, the named secrets' own bindings (``gcloud secrets
    add-iam-policy-binding``) and, for an ``airflow_*`` reference, the conditioned project binding of
    the runs' own secrets (``gcloud projects add-iam-policy-binding ... --condition``)."""
    out: dict[str, Any] | None = json.loads(json.dumps(role)) if role is not None else None
    if out is not None:
        out["includedPermissions"] = [p for p in out["includedPermissions"] if p != ACCESS_VERSION]
    secrets = sorted({secret_of(r) for r in refs if r.scheme == GCP_SECRET})
    bindings = [{"secret": s, "role": ACCESSOR_ROLE} for s in secrets]
    bindings += [run_secrets_binding()] if _by_operator(refs) else []
    return {"role": out, "secretBindings": bindings}


def binding_commands(
    bindings: Iterable[Mapping[str, Any]], member: str = "serviceAccount:SA_EMAIL"
) -> list[str]:
    """The ``gcloud`` lines that grant each binding to the VMs' service account."""
    lines = []
    for binding in bindings:
        if "condition" in binding:
            condition = binding["condition"]
            lines.append(
                f"gcloud projects add-iam-policy-binding {binding['project']} --member {member} "
                f"--role {binding['role']} "
                f"--condition='expression={condition['expression']},title={condition['title']}'"
            )
            continue
        project, secret = binding["secret"].split("/")[1], binding["secret"].split("/")[3]
        lines.append(
            f"gcloud secrets add-iam-policy-binding {secret} --project {project} "
            f"--member {member} --role {binding['role']}"
        )
    return lines
