"""``cloudtrain``: the command line. ``cloudtrain plan`` shows which offer a spec would get.

The studio tool chose the instance silently; ``plan`` makes the choice visible, with the next
alternatives and what a bid means in dollars, so a user can check a spec before a DAG runs.
It uses only the local catalog (snapshot plus any fresh live cache): no network call.

``cloudtrain runs show RUN_ID_OR_URI`` prints the cost ledger of a checkpoint-resume run from its run
folder (``ledger/<run_id>.json``): every attempt, how it ended, what it cost, the step it restored
and the work it lost. It needs the bucket's credentials, not Airflow.

``cloudtrain costs [--bucket B] [--since 7d] [--by dag|task|day|cloud] [--json|--csv]`` adds up what
training cost from the bucket's cost index (``cli_costs``).

``cloudtrain jobs list [--running]`` and ``cloudtrain jobs logs JOB_ID [--follow --polling-interval S]``
show Vertex AI training jobs (``cli_jobs``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from airflow_cloudtrain.spec import CLOUDS


def _plan(args: argparse.Namespace) -> int:
    from airflow_cloudtrain.catalog import SNAPSHOT_SOURCE, NoOfferError, rank_offers
    from airflow_cloudtrain.spec import Bid, Hardware

    try:
        ram, hdd = args.ram, args.hdd
        if ram is not None or hdd is not None:  # the operator's rules (ram under 512 MiB is a unit mistake)
            with contextlib.redirect_stdout(sys.stderr):  # Airflow's import may log: not into --json
                from airflow_cloudtrain.operators.config import parse_hdd, parse_ram

            ram = None if ram is None else f"{parse_ram(ram)}m"
            hdd = None if hdd is None else f"{parse_hdd(hdd)}g"
        hardware = Hardware(args.cpus, args.gpus, ram, hdd, args.gpu_type)
        bid = Bid(args.bid) if args.bid is not None else None
        offers = rank_offers(args.cloud, hardware, region=args.region, zone=args.zone, bid=bid)
    except NoOfferError as err:
        print(f"cloudtrain plan: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"cloudtrain plan: {err}", file=sys.stderr)
        return 2
    shown = offers[: args.alternatives + 1]

    def bid_usd(o: Any) -> float | None:
        return bid.max_price(o.price) if bid is not None and o.is_spot and args.cloud != "gcspot" else None

    if args.json:
        doc = {
            "cloud": args.cloud,
            "hardware": hardware.to_dict(),
            "bid": str(bid) if bid else None,
            "chosen": {**shown[0].to_dict(), "bid_usd": bid_usd(shown[0])},
            "alternatives": [{**o.to_dict(), "bid_usd": bid_usd(o)} for o in shown[1:]],
            "source": SNAPSHOT_SOURCE,
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(f"cloud={args.cloud}  wants {hardware}")
    header = f"{'':2}{'instance type':<22}{'region':<14}{'vCPUs':>6}{'GiB':>8}{'GPUs':>10}{'on-demand':>11}{'spot':>9}"
    if bid is not None and args.cloud == "ec2spot":
        header += f"{'bid $/h':>9}"
    print(header)
    for i, o in enumerate(shown):
        gpus = f"{o.gpus}x{o.gpu_type}" if o.gpus else "-"
        line = (
            f"{'*' if i == 0 else ' ':2}{o.instance_type:<22}{o.region:<14}{o.vcpus:>6g}{o.memory_gib:>8g}{gpus:>10}"
            f"{_usd(o.price):>11}{_usd(o.spot_price):>9}"
        )
        if bid is not None and args.cloud == "ec2spot":
            line += f"{_usd(bid_usd(o)):>9}"
        print(line + ("  (derived price)" if o.derived else ""))
    chosen = shown[0]
    print(
        f"\nchosen: {chosen.describe()} at ${chosen.hourly:g}/h ({'spot' if chosen.is_spot else 'on-demand'})"
    )
    if bid is not None and args.cloud == "ec2spot":
        print(
            f"bid {bid} = at most ${bid_usd(chosen):g}/h for {chosen.instance_type}; you pay the market price below it"
        )
    print(f"prices: {SNAPSHOT_SOURCE} (live prices are used when a task runs)")
    return 0


def _port(text: str) -> int:
    """A base port the 7 servers fit above (0: free ports)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port {text!r} is not a number; give e.g. 4750") from None
    if port != 0 and not 1024 <= port <= 65535 - 6:
        raise argparse.ArgumentTypeError(
            f"--port {port} is out of range; give 1024..65529, or 0 for free ports"
        )
    return port


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def _runs_show(args: argparse.Namespace) -> int:
    """Print the ledger(s) of a run: by run URI, or by run id through ``<bucket>/index/<id>.json``."""
    import os

    from airflow_cloudtrain.lifecycle.resume.history import LEDGER_PREFIX, format_ledger, index_key
    from airflow_cloudtrain.storage import open_run_folder

    target, run_id = args.run, None
    if not target.startswith(("s3://", "gs://")):
        bucket = args.bucket or os.environ.get("CLOUDTRAIN_BUCKET")
        if not bucket:
            print(
                "cloudtrain runs show: give --bucket (or CLOUDTRAIN_BUCKET) to find a run id", file=sys.stderr
            )
            return 2
        run_id = target
        raw = open_run_folder(bucket).get_text(index_key(run_id))
        if not raw:
            print(f"cloudtrain runs show: no run {run_id} under {bucket}", file=sys.stderr)
            return 1
        target = json.loads(raw)["run_uri"]
    from airflow_cloudtrain.cli_leases import lease_state, orphaned_line

    folder = open_run_folder(target)
    keys = [k for k in folder.list(f"{LEDGER_PREFIX}/") if k.endswith(".json")]
    if run_id is not None:  # that run's ledger first, then earlier runs that wrote to the folder
        keys.sort(key=lambda k: k != f"{LEDGER_PREFIX}/{run_id}.json")
    lease = orphaned_line(folder)  # orphaned (and when its lease lapsed), lapsed, or watched
    if not keys and lease is None:
        print(f"cloudtrain runs show: no ledger in {target}", file=sys.stderr)
        return 1
    ledgers = [json.loads(folder.get_text(k) or "{}") for k in keys]
    if args.json:
        if lease is not None:  # each ledger as before, with the run's lease beside its attempts
            state = lease_state(folder)
            ledgers = [{**ledger, "lease": state} for ledger in ledgers] or [{"lease": state}]
        print(json.dumps(ledgers if len(ledgers) > 1 else ledgers[0], indent=2))
        return 0
    print("\n\n".join([*(format_ledger(ledger) for ledger in ledgers), *([lease] if lease else [])]))
    return 0


def _emulator(args: argparse.Namespace) -> int:
    if args.action == "status":
        from airflow_cloudtrain.cli_emulator import status

        return status(args)
    from airflow_cloudtrain.emulator import serve_forever

    return serve_forever(base_port=args.port, workdir=args.state_dir, env_file=args.env_file)


def _plain(text: str) -> str:
    """Help text without the reStructuredText markup of the docstrings it comes from."""
    return text.replace("``", "").replace("`", "")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cloudtrain", description=_plain(__doc__.splitlines()[0]))
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="show the offer a hardware spec gets, and the alternatives")
    plan.add_argument("--cloud", required=True, choices=CLOUDS)
    plan.add_argument("--cpus", default="1")
    plan.add_argument("--gpus", default="0")
    plan.add_argument(
        "--ram", default=None, help="e.g. 32g, 512m, 1.5GiB (at least 512 MiB; rounded up to 256 MiB)"
    )
    plan.add_argument("--hdd", default=None, help="e.g. 200g (10 GiB to 64 TiB)")
    plan.add_argument("--gpu-type", default=None, help="e.g. A10G, T4, V100")
    plan.add_argument("--bid", default=None, help="spot bid: 0.45 (USD/h) or 60%% (of on-demand)")
    plan.add_argument("--region", default=None)
    plan.add_argument("--zone", default=None)
    plan.add_argument("--alternatives", type=int, default=4, help="how many next offers to show")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_plan)
    runs = sub.add_parser("runs", help="look at runs in their run folders").add_subparsers(
        dest="runs_command", required=True
    )
    show = runs.add_parser("show", help="print the cost ledger of a run (its attempts, cost, resumes)")
    show.add_argument("run", help="a run id (ct-...; needs --bucket) or a run URI (s3://... / gs://...)")
    show.add_argument("--bucket", default=None, help="the operator's bucket (default: $CLOUDTRAIN_BUCKET)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_runs_show)
    from airflow_cloudtrain.cli_costs import add_costs_parser

    add_costs_parser(sub)  # cloudtrain costs
    __import__("airflow_cloudtrain.cli_leases").cli_leases.add_runs_list(runs)  # cloudtrain runs list
    from airflow_cloudtrain.cli_jobs import add_jobs_parser

    add_jobs_parser(sub)
    from airflow_cloudtrain.cli_up import add_up_parser
    from airflow_cloudtrain.cli_up_production import production_airflow

    add_up_parser(sub, production_airflow)  # cloudtrain up [--production]
    __import__("airflow_cloudtrain.cli_gc").cli_gc.add_gc_parser(sub)  # cloudtrain gc
    __import__("airflow_cloudtrain.cli_permissions").cli_permissions.add_permissions_parser(sub)
    emu = sub.add_parser(
        "emulator",
        help="run the emulated clouds in the foreground (Ctrl-C or SIGTERM stops them); "
        "'cloudtrain emulator status' lists what they run",
        description="Run the emulated clouds on loopback until Ctrl-C or SIGTERM. The servers listen on "
        "fixed ports, PORT to PORT+6 (AWS, Compute Engine, GCS, Pub/Sub, Vertex AI, instance metadata, "
        "Secret Manager), so a restart keeps the endpoints Airflow was started with. With a --state-dir "
        "the clouds' state (instances, buckets, ...) is kept there across a restart. "
        "'cloudtrain emulator status' lists the instances a running emulator runs (its endpoints from "
        "--env-file, the environment, or .airflow_home/emulator.env).",
    )
    emu.add_argument(
        "action",
        nargs="?",
        choices=("serve", "status"),
        default="serve",
        help="serve (the default): run the clouds; status: list the instances they run now",
    )
    emu.add_argument("--json", action="store_true", help="status: as JSON")
    from airflow_cloudtrain.emulator import DEFAULT_BASE_PORT

    emu.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_BASE_PORT,
        help=f"first of the 7 consecutive ports the servers take (default {DEFAULT_BASE_PORT}; 0: free ports)",
    )
    emu.add_argument(
        "--env-file",
        default=None,
        metavar="PATH",
        help="write the 'export ...' lines (endpoints, credentials, AIRFLOW_CONN_* connections) there; "
        "'source PATH' in every shell that runs an Airflow process (status: read the endpoints there)",
    )
    emu.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="work directory (instances' agent logs, Vertex AI files) and the clouds' saved state, kept "
        "on exit and restored on the next start (default: a temporary one, removed on exit)",
    )
    emu.set_defaults(func=_emulator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from airflow_cloudtrain.cli_errors import run_command

    args = build_parser().parse_args(argv)
    sub = getattr(args, f"{args.command}_command", None) or getattr(args, "action", None)
    prog = f"cloudtrain {args.command}" + (f" {sub}" if sub and sub != "serve" else "")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda msg, *a, **k: print(f"warning: {msg}", file=sys.stderr)
        return run_command(args.func, args, prog)


if __name__ == "__main__":
    sys.exit(main())
