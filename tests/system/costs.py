"""What one pass of the system tests costs on a real account, from the catalog's price snapshot (not
guessed): each DAG's cheapest offer for its hardware, times the minutes an instance lives in a run
(boot, a seconds-long job, upload, teardown: ``MINUTES``), per instance. ``python tests/system/costs.py``
prints the README table; ``test_costs.py`` checks the README has it."""

from __future__ import annotations

from dataclasses import dataclass

MINUTES = 5  # launch to terminate of one instance in one of these runs (about 1-2 of them is boot)


@dataclass(frozen=True)
class Row:
    dag: str
    cloud: str
    machine: str
    usd_per_hour: float
    instances: int

    @property
    def usd(self) -> float:
        return self.usd_per_hour * self.instances * MINUTES / 60


def rows() -> list[Row]:
    from airflow_cloudtrain.catalog import rank_offers
    from airflow_cloudtrain.mlengine.pricing import hourly_price
    from airflow_cloudtrain.operators.mlengine_config import parse_job_config
    from airflow_cloudtrain.spec import Hardware

    out = []
    for dag, cloud, region, instances in (
        ("example_cloud_train", "ec2spot", "us-east-1", 1),
        ("example_checkpoint_resume", "gcspot", "us-central1", 1),
        ("example_spot_fleet", "ec2spot", "us-east-1", 1),
        ("example_preemptible_group", "gcspot", "us-central1", 1),
    ):
        offer = rank_offers(cloud, Hardware(2, 0, "4g"), region)[0]
        out.append(Row(dag, f"{cloud} {region}", offer.instance_type, float(offer.hourly or 0), instances))
    config = parse_job_config(
        {
            "region": "us-central1",
            "bucket": "gs://system-bucket",
            "python_module": "sysjob.task",
            "code": "gs://system-bucket/p.tar.gz",
            "scale_tier": "BASIC",
        }
    )
    (pool,) = config.pools
    price = hourly_price(pool.machine, "us-central1", False) or 0.0
    out.append(
        Row("example_mlengine_train", "Vertex AI us-central1", pool.machine.describe(), price, pool.count)
    )
    return out


def markdown() -> str:
    lines = [
        "| System test DAG | Cloud | Machine | USD/hour | Instances | USD per pass |",
        "|---|---|---|---|---|---|",
    ]
    table = rows()
    for r in table:
        lines.append(
            f"| `{r.dag}` | {r.cloud} | {r.machine} | {r.usd_per_hour:.4f} | {r.instances} | {r.usd:.4f} |"
        )
    lines.append(f"| all five | | | | | {sum(r.usd for r in table):.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
