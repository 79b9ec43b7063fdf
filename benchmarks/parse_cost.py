"""What a DAG file pays to use our operators, beside the Amazon provider's: modules loaded and time.

Each row runs in fresh processes (``--runs`` of them, 5 at least), after ``import airflow.sdk`` (which
every DAG file pays anyway), with bytecode compiled first, the rows interleaved so that a busy machine
slows all of them alike. It counts the ``sys.modules`` entries the step adds, of the row's own package
(``airflow_cloudtrain``, ``airflow.providers.amazon``) and of any package, and times the step.

- import: what a DAG file's import lines load (the five operators and the two sensors; the Amazon
  provider's EC2 create/terminate operators, and its SageMaker training operator if installed).
- construct: one of each class built with typical arguments after the import (the parse-time checks),
  counted from the end of the import.

Goal (issue 23): our import loads at most 15 of our modules and takes at most a third of the Amazon
EC2 import's time.

    python benchmarks/parse_cost.py [--runs 7]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OURS = """
from airflow_cloudtrain.operators import (CloudTrainOperator, CheckpointResumeOperator, SpotFleetOperator,
    PreemptibleGroupOperator, MLEngineTrainOperator)
from airflow_cloudtrain.sensors import InstanceStatusSensor, QueueDepthSensor
"""
OURS_CONSTRUCT = """
CloudTrainOperator(task_id="train", command="python train.py", bucket="s3://my-bucket/training",
    cloud="ec2spot", cpus=4, gpus=1, ram="16g", bid="60%")
CheckpointResumeOperator(task_id="resume", command="python train.py", bucket="s3://my-bucket/training",
    cloud="ec2spot", gpus=1, checkpoint_dir="/tmp/checkpoints", max_restarts=5)
SpotFleetOperator(task_id="fleet", command="python trial.py", bucket="s3://my-bucket/sweeps",
    work_items=["lr=0.1", "lr=0.01"], num_workers=2, max_workers=4)
PreemptibleGroupOperator(task_id="group", command="python trial.py", bucket="gs://my-bucket/sweeps",
    work_items=["lr=0.1", "lr=0.01"], num_workers=2, project_id="my-project", zone="us-central1-a")
MLEngineTrainOperator(task_id="vertex", python_module="trainer.task", code="gs://my-bucket/pkg/trainer-0.1.tar.gz",
    training_args=["--steps", "100"], scale_tier="BASIC_GPU", project_id="my-project", region="us-central1",
    bucket="gs://my-bucket/jobs")
InstanceStatusSensor(task_id="up", cloud="ec2", instance_ids=["i-0123456789abcdef0"], region="us-east-1")
QueueDepthSensor(task_id="drained", queue="https://sqs.us-east-1.amazonaws.com/123456789012/work", max_depth=0)
"""
AMAZON_EC2 = """
from airflow.providers.amazon.aws.operators.ec2 import EC2CreateInstanceOperator, EC2TerminateInstanceOperator
"""
AMAZON_EC2_CONSTRUCT = """
EC2CreateInstanceOperator(task_id="create", image_id="ami-0123456789abcdef0", max_count=1, min_count=1,
    config={"InstanceType": "g5.xlarge"}, region_name="us-east-1")
EC2TerminateInstanceOperator(task_id="terminate", instance_ids=["i-0123456789abcdef0"], region_name="us-east-1")
"""
AMAZON_SAGEMAKER = """
from airflow.providers.amazon.aws.operators.sagemaker import SageMakerTrainingOperator
"""
AMAZON_SAGEMAKER_CONSTRUCT = """
SageMakerTrainingOperator(task_id="sm", config={"TrainingJobName": "job"}, wait_for_completion=False)
"""

# Runs in a fresh interpreter: the step's sys.modules growth and time, as JSON.
PROBE = """
import json, sys, time
import airflow.sdk
def snap(): return set(sys.modules)
before = snap(); t0 = time.perf_counter()
exec(compile({imp!r}, "<import>", "exec"))
t1 = time.perf_counter(); after_import = snap()
exec(compile({construct!r}, "<construct>", "exec"))
t2 = time.perf_counter(); after_construct = snap()
own = lambda names: sorted(m for m in names if m == {pkg!r} or m.startswith({pkg!r} + "."))
print(json.dumps({{
    "import_ms": (t1 - t0) * 1000, "construct_ms": (t2 - t1) * 1000,
    "import_own": own(after_import - before), "import_all": len(after_import - before),
    "construct_own": own(after_construct - after_import), "construct_all": len(after_construct - after_import),
}}))
"""


def rows() -> list[tuple[str, str, str, str]]:
    """(label, package counted, import code, construction code)."""
    found = [
        ("airflow_cloudtrain: 5 operators + 2 sensors", "airflow_cloudtrain", OURS, OURS_CONSTRUCT),
        (
            "amazon: EC2 create/terminate operators",
            "airflow.providers.amazon",
            AMAZON_EC2,
            AMAZON_EC2_CONSTRUCT,
        ),
    ]
    if importlib.util.find_spec("airflow.providers.amazon.aws.operators.sagemaker") is not None:
        found.append(
            (
                "amazon: SageMaker training operator",
                "airflow.providers.amazon",
                AMAZON_SAGEMAKER,
                AMAZON_SAGEMAKER_CONSTRUCT,
            )
        )
    return found


def probe(pkg: str, imp: str, construct: str) -> dict:
    code = PROBE.format(imp=imp, construct=construct, pkg=pkg)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=300
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per row (at least 5)")
    parser.add_argument("--list", action="store_true", help="also print our modules each step loads")
    args = parser.parse_args()
    runs = max(5, args.runs)
    compileall.compile_dir(str(ROOT / "airflow_cloudtrain"), quiet=1)
    table = rows()
    for _, pkg, imp, construct in table:  # warm-up: writes any missing bytecode, fills the OS cache
        probe(pkg, imp, construct)
    results: dict[str, list[dict]] = {label: [] for label, *_ in table}
    for _ in range(runs):
        for label, pkg, imp, construct in table:
            results[label].append(probe(pkg, imp, construct))

    head = (
        f"{'row':<46} {'import: own/all modules':>24} {'import ms median/min':>21} "
        f"{'construct: own/all':>19} {'construct ms median/min':>24}"
    )
    print(f"{runs} fresh processes per row, after `import airflow.sdk`; Python {sys.version.split()[0]}")
    print(head)
    print("-" * len(head))
    for label, samples in results.items():
        last = samples[-1]
        imp_ms = [s["import_ms"] for s in samples]
        con_ms = [s["construct_ms"] for s in samples]
        print(
            f"{label:<46} {len(last['import_own']):>12} / {last['import_all']:<9} "
            f"{statistics.median(imp_ms):>10.1f} / {min(imp_ms):<8.1f} "
            f"{len(last['construct_own']):>8} / {last['construct_all']:<8} "
            f"{statistics.median(con_ms):>12.1f} / {min(con_ms):<8.1f}"
        )
    ours = results[table[0][0]]
    ec2 = results[table[1][0]]
    ratio = statistics.median(s["import_ms"] for s in ours) / statistics.median(s["import_ms"] for s in ec2)
    print(f"\nour import / Amazon EC2 import (medians): {ratio:.2f} (goal: at most 0.33; 15 modules at most)")
    if args.list:
        print("\nour modules, import:", *ours[-1]["import_own"], sep="\n  ")
        print("our modules, construct:", *ours[-1]["construct_own"], sep="\n  ")


if __name__ == "__main__":
    main()
