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


def test_plan_refuses_ram_under_512_mib_with_the_operators_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from airflow_cloudtrain.operators.config import parse_ram

    assert main(["plan", "--cloud", "ec2", "--ram", "1"]) == 2
    err = capsys.readouterr().err
    with pytest.raises(ValueError) as operator_says:
        parse_ram("1")
    assert err.strip() == f"cloudtrain plan: {operator_says.value}"
    assert "ram='1' is 1 MiB, too small" in err
    assert main(["plan", "--cloud", "ec2", "--ram", "512m", "--json"]) == 0  # the smallest accepted
    assert json.loads(capsys.readouterr().out)["hardware"]["ram_mib"] == 512


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``cloudtrain ...`` as a user runs it, in an environment without credentials or connections."""
    import os

    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "AIRFLOW_CONN_", "GOOGLE_")) and k != "STORAGE_EMULATOR_HOST"
    }
    # no credential lookups on this machine's metadata services (they wait for timeouts)
    clean.update({"AWS_EC2_METADATA_DISABLED": "true", "NO_GCE_CHECK": "True"}, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "airflow_cloudtrain.cli", *args],
        capture_output=True,
        text=True,
        env=clean,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("runs", "show", "ct-1", "--bucket", "s3://cloudtrain-emulated"), "AWS_ACCESS_KEY_ID"),
        (("runs", "show", "gs://cloudtrain-emulated/runs/x"), "GOOGLE_APPLICATION_CREDENTIALS"),
        (("jobs", "list"), "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"),
        (("jobs", "logs", "some-job", "--conn-id", "my_gcp"), "AIRFLOW_CONN_MY_GCP"),
    ],
)
def test_a_missing_credential_or_connection_is_one_line_naming_what_to_set(
    args: tuple[str, ...], names: str
) -> None:
    done = _cli(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"cloudtrain {args[0]} {args[1]}: ") and names in lines[0], lines[0]
    assert "source .airflow_home/emulator.env" in lines[0]


def test_emulator_status_without_endpoints_is_one_line(tmp_path: pytest.TempPathFactory) -> None:
    done = _cli("emulator", "status", "--env-file", f"{tmp_path}/missing.env")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--env-file" in done.stderr, done.stderr


def test_help_is_plain_text_without_rst_markup() -> None:
    for args in ([], ["plan"], ["runs", "show"], ["jobs", "list"], ["up"], ["emulator"]):
        done = _cli(*args, "--help")
        assert done.returncode == 0, done.stderr
        assert "``" not in done.stdout and "`" not in done.stdout, done.stdout
    assert _cli("--help").stdout.splitlines()[2].startswith("cloudtrain: the command line. cloudtrain plan")


def test_the_signing_keys_are_64_bytes_and_shorter_ones_are_replaced(
    tmp_path: pytest.TempPathFactory,
) -> None:
    from pathlib import Path

    from airflow_cloudtrain.cli_up import SECRETS_FILE, home_secrets

    home = Path(str(tmp_path))
    made = home_secrets(home)
    signing = ("jwt_secret", "api_secret_key")  # the API's tokens and the log servers' tokens
    assert all(len(made[k].encode()) >= 64 for k in signing)  # HS512: Airflow warns below 64 bytes
    assert home_secrets(home) == made  # kept: a restart keeps logins and the database's Fernet key
    saved = json.loads((home / SECRETS_FILE).read_text())
    old = {k: "x" * 43 for k in signing}  # what an older version made
    (home / SECRETS_FILE).write_text(json.dumps({**saved, **old}))
    again = home_secrets(home)
    assert all(len(again[k].encode()) >= 64 and again[k] != old[k] for k in signing)
    assert {k: again[k] for k in ("fernet_key", "password")} == {
        k: made[k] for k in ("fernet_key", "password")
    }


def test_jobs_polling_interval_takes_the_operators_durations(capsys: pytest.CaptureFixture[str]) -> None:
    """``cloudtrain jobs logs --polling-interval`` reads durations as every operator does."""
    from airflow_cloudtrain.cli_jobs import _duration

    assert _duration("1m30s") == 90.0 and _duration("45") == 45.0
    with pytest.raises(SystemExit) as exited:
        main(["jobs", "logs", "some-job", "--polling-interval", "1h1h"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--polling-interval='1h1h' is not a valid duration" in err and "1h30m" in err


def test_a_free_port_for_the_deployment_is_below_the_kernels_ephemeral_range() -> None:
    """The api-server's and log servers' ports: a port of the ephemeral range could be taken by any
    connection's local port before the server binds it (``cli_up.free_port``)."""
    import socket

    from airflow_cloudtrain.cli_up import ephemeral_ports_start, free_port

    for _ in range(20):
        port = free_port()
        assert port < ephemeral_ports_start()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free, as promised (nothing else binds below the range here)
