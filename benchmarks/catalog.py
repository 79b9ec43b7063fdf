"""How fast is choose_offer? Median and p99 over a spread of requests, on the full snapshot.

Goal: at most 1 ms median after the first call (DAG files call it at parse time). The naive
alternative beside it re-reads and scans the CSV rows on every call, as a tool without a
prepared catalog would.

    python benchmarks/catalog.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import time

from airflow_cloudtrain.catalog import NoOfferError, choose_offer
from airflow_cloudtrain.catalog.snapshot import DATA_DIR, parse_rows
from airflow_cloudtrain.spec import Hardware

REQUESTS = [
    Hardware(cpus, gpus, ram)
    for cpus, gpus, ram in itertools.product((1, 4, 8, 32), (0, 1, 4), ("2g", "32g", "200g"))
]


def naive_choose(cloud: str, hw: Hardware) -> object:
    """Re-read the CSV and scan it: what the first call costs without the prepared catalog."""
    provider = "aws" if cloud.startswith("ec2") else "gcp"
    with (DATA_DIR / f"{provider}.csv").open() as fh:
        rows = parse_rows(fh)
    best = None
    for r in rows:
        price = r.spot_min if cloud.endswith("spot") else r.price
        if (
            price is None
            or r.vcpus < hw.cpus
            or r.accelerator_count < hw.gpus
            or r.memory_gib * 1024 < (hw.ram_mib or 0)
        ):
            continue
        if best is None or price < best[0]:
            best = (price, r.instance_type)
    return best


def measure(fn, cloud: str, repeat: int) -> tuple[float, float, float]:
    first_start = time.perf_counter()
    with contextlib.suppress(NoOfferError):
        fn(cloud, REQUESTS[0])
    first = time.perf_counter() - first_start
    samples = []
    for _ in range(repeat):
        for hw in REQUESTS:
            start = time.perf_counter()
            with contextlib.suppress(NoOfferError):
                fn(cloud, hw)
            samples.append(time.perf_counter() - start)
    samples.sort()
    return first * 1e3, statistics.median(samples) * 1e3, samples[int(len(samples) * 0.99)] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    print(f"choose_offer over {len(REQUESTS)} requests x {args.repeat} repeats (times in ms)\n")
    print("| cloud   | implementation            | first call | median | p99    |")
    print("|---------|---------------------------|-----------:|-------:|-------:|")
    for cloud in ("ec2", "ec2spot", "gcloud", "gcspot"):
        for name, fn in (("choose_offer", choose_offer), ("naive: re-read CSV + scan", naive_choose)):
            first, med, p99 = measure(
                fn, cloud, args.repeat if fn is choose_offer else max(1, args.repeat // 10)
            )
            print(f"| {cloud:<7} | {name:<25} | {first:>10.3f} | {med:>6.3f} | {p99:>6.3f} |")


if __name__ == "__main__":
    main()
