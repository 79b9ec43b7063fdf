"""Write the permission documents from the committed record of API calls (``tests/data/api_calls.json``).

    python -m airflow_cloudtrain.permissions.generate [--record tests/data/api_calls.json] [--check]
    python -m airflow_cloudtrain.permissions.generate --merge DIR   # a recording run's files -> record

``make permissions`` runs the suite with ``CLOUDTRAIN_RECORD_CALLS`` set (each test that runs an
operator appends its calls to ``DIR/calls-<worker>.jsonl``), merges them into the record and writes
the documents. The output is a pure function of the record, the tables in ``actions``/``rules``, the
calls ``secret_env`` makes (``secret_calls``: from the agent's reader and the operators' signatures,
not from the record), a catalog refresh's (``catalog_calls``: from the catalog's code and the
operators' signatures) and the run folder's deletes on paths a recording may miss (``folder_calls``),
so the unit test can regenerate and compare (``--check``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow_cloudtrain.permissions import DATA, catalog_calls, folder_calls, rules, secret_calls
from airflow_cloudtrain.permissions.actions import permissions_for

RECORD = Path(__file__).resolve().parents[2] / "tests" / "data" / "api_calls.json"
KEYS = ("operator", "provider", "side", "service", "operation")
_SIDE_WORDS = {
    ("aws", "airflow"): "the role of the Airflow AWS connection (aws_default)",
    ("aws", "instance"): "the role of the instance profile its instances run with",
    ("gcp", "airflow"): "the service account of the Airflow Google connection (google_cloud_default)",
    ("gcp", "instance"): "the service account its VMs (or Vertex AI jobs) run as",
}


def load_record(path: Path = RECORD) -> list[dict[str, str]]:
    return list(json.loads(path.read_text())["calls"])


def merge(folder: Path, record: Path = RECORD) -> int:
    """A recording run's ``calls-*.jsonl`` -> the record (replaced: it is what that run called)."""
    rows = {
        tuple(json.loads(line)[k] for k in KEYS)
        for file in sorted(folder.glob("calls-*.jsonl"))
        for line in file.read_text().splitlines()
        if line.strip()
    }
    calls = [dict(zip(KEYS, row, strict=True)) for row in sorted(rows)]
    about = "API calls of the suite's operator runs, by side; `make permissions` rewrites it. Do not edit."
    record.write_text(json.dumps({"about": about, "calls": calls}, indent=1) + "\n")
    return len(calls)


def _aws_policy(actions: set[str], side: str) -> dict[str, Any]:
    statements: list[dict[str, Any]] = []
    tag_any = {"StringLike": {f"aws:RequestTag/{rules.TAG}": "*"}}
    for action, (tagged, used) in sorted(rules.CREATES.items()):
        if action not in actions:
            continue
        name = action.split(":")[1]
        statements.append(
            {
                "Sid": f"{name}Tagged",
                "Effect": "Allow",
                "Action": [action],
                "Resource": [f"{rules.ARN}{t}/*" for t in tagged],
                "Condition": tag_any,
            }
        )
        if used:
            statements.append(
                {
                    "Sid": f"{name}Uses",
                    "Effect": "Allow",
                    "Action": [action],
                    "Resource": [f"{rules.ARN}{t}/*" for t in used],
                }
            )
    if "ec2:CreateTags" in actions:
        statements.append(
            {
                "Sid": "TagOnCreate",
                "Effect": "Allow",
                "Action": ["ec2:CreateTags"],
                "Resource": "*",
                "Condition": {"StringEquals": {"ec2:CreateAction": list(rules.TAGGABLE_CREATES)}},
            }
        )
    scoped = sorted(actions & rules.ON_TAGGED)
    if scoped:
        statements.append(
            {
                "Sid": "OnlyTagged",
                "Effect": "Allow",
                "Action": scoped,
                "Resource": "*",
                "Condition": {"StringLike": {f"aws:ResourceTag/{rules.TAG}": "*"}},
            }
        )
    requested = sorted(actions & rules.REQUEST_TAGGED)
    if requested:
        statements.append(
            {
                "Sid": "CreateTagged",
                "Effect": "Allow",
                "Action": requested,
                "Resource": "*",
                "Condition": tag_any,
            }
        )
    if "iam:PassRole" in actions:
        statements.append(
            {
                "Sid": "PassInstanceRole",
                "Effect": "Allow",
                "Action": ["iam:PassRole"],
                "Resource": "*",
                "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            }
        )
    by_resource: dict[str, list[str]] = {}
    for action in sorted(actions & set(rules.BY_NAME)):
        by_resource.setdefault(rules.BY_NAME[action], []).append(action)
    for resource, named in sorted(by_resource.items()):
        sid = "OwnQueues" if resource == rules.QUEUES else "OwnParameters"
        statements.append({"Sid": sid, "Effect": "Allow", "Action": named, "Resource": [resource]})
    on_side = {a: r for (s, a), r in rules.ON_SIDE.items() if s == side and a in actions}
    for action, resource in sorted(on_side.items()):
        sid = rules.SIDS.get(resource, action.split(":")[1])
        statements.append({"Sid": sid, "Effect": "Allow", "Action": [action], "Resource": [resource]})
    special = set(rules.CREATES) | {"ec2:CreateTags", "iam:PassRole"} | rules.ON_TAGGED | rules.REQUEST_TAGGED
    special |= set(rules.BY_NAME) | set(on_side)
    rest = sorted(actions - special)
    if rest:
        statements.append({"Sid": "Other", "Effect": "Allow", "Action": rest, "Resource": "*"})
    return {"Version": "2012-10-17", "Statement": statements}


def _gcp_role(operator: str, side: str, permissions: set[str]) -> dict[str, Any]:
    return {
        "title": f"CloudTrain {operator} ({side} side)",
        "description": f"What {operator} needs for {_SIDE_WORDS[('gcp', side)]}; generated, do not edit.",
        "stage": "GA",
        "includedPermissions": sorted(permissions),
    }


def needed(rows: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The record's calls with those taken from the code: every ``secret_env`` operator's secret reads,
    every ``live_prices`` operator's catalog refresh, the run folder's deletes (``folder_calls``)."""
    return folder_calls.needed(catalog_calls.needed(secret_calls.needed(rows)))


def documents(rows: Iterable[Mapping[str, str]]) -> dict[str, dict[str, Any]]:
    """File name -> document, for every operator x provider x side the record has calls of."""
    needs: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for row in needed(rows):
        key = (row["operator"], row["provider"], row["side"])
        needs[key].update(permissions_for(row["provider"], row["service"], row["operation"]))
    out: dict[str, dict[str, Any]] = {}
    for (operator, provider, side), perms in sorted(needs.items()):
        unmapped = sorted(p for p in perms if p.startswith("unmapped:"))
        if unmapped:
            raise ValueError(
                f"calls with no known permission (add them to permissions/actions.py): {unmapped}"
            )
        if not perms:
            continue
        doc = _aws_policy(perms, side) if provider == "aws" else _gcp_role(operator, side, perms)
        out[f"{operator}.{provider}.{side}.json"] = doc
    return out


def render(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def write(rows: Iterable[Mapping[str, str]], folder: Path = DATA) -> list[str]:
    docs = documents(rows)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        if old.name not in docs:
            old.unlink()
    for name, doc in docs.items():
        (folder / name).write_text(render(doc))
    return sorted(docs)


def stale(rows: Iterable[Mapping[str, str]], folder: Path = DATA) -> list[str]:
    """Documents that differ from what the record generates (missing, extra or edited)."""
    docs = documents(rows)
    have = {p.name for p in folder.glob("*.json")}
    out = sorted(have - set(docs))
    out += sorted(n for n, d in docs.items() if n not in have or (folder / n).read_text() != render(d))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--record", type=Path, default=RECORD)
    parser.add_argument("--merge", type=Path, help="a recording run's folder: rewrite the record from it")
    parser.add_argument("--check", action="store_true", help="fail when the documents are not the record's")
    args = parser.parse_args(argv)
    if args.merge:
        print(f"{merge(args.merge, args.record)} distinct calls -> {args.record}")
    rows = load_record(args.record)
    if args.check:
        bad = stale(rows)
        for name in bad:
            print(f"stale: {name}", file=sys.stderr)
        return 1 if bad else 0
    for name in write(rows):
        print(DATA / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
