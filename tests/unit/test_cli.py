"""``cloudtrain plan``: the studio tool's hidden choice made visible."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_cloudtrain.catalog import rank_offers
from airflow_cloudtrain.cli import main
from airflow_cloudtrain.spec import Hardware


def test_plan_json_chosen_and_alternatives(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "--cloud",
                "ec2spot",
                "--cpus",
                "8",
                "--gpus",
                "1",
                "--ram",
                "32g",
                "--bid",
                "60%",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    ranked = rank_offers("ec2spot", Hardware(8, 1, "32g"), bid="60%")
    assert doc["chosen"]["instance_type"] == ranked[0].instance_type
    assert doc["chosen"]["bid_usd"] == pytest.approx(ranked[0].price * 0.6)
    assert [a["instance_type"] for a in doc["alternatives"]] == [o.instance_type for o in ranked[1:5]]
    assert "skypilot-catalog" in doc["source"]


def test_plan_table_names_prices_and_bid_in_dollars() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_cloudtrain.cli",
            "plan",
            "--cloud",
            "ec2spot",
            "--cpus",
            "8",
            "--gpus",
            "1",
            "--ram",
            "32g",
            "--bid",
            "60%",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "* g4dn.2xlarge" in out and "on-demand" in out and "spot" in out
    assert "bid 60% = at most $0.4512/h for g4dn.2xlarge" in out


def test_plan_bad_input_exits_2_with_field_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--cloud", "ec2", "--ram", "12q"]) == 2
    assert "ram='12q'" in capsys.readouterr().err
    assert main(["plan", "--cloud", "ec2", "--cpus", "900"]) == 2
    assert "Largest offers" in capsys.readouterr().err
