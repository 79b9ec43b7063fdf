"""``make demo`` draws retrain_spot's attempts as the Cloud training page does: from the bucket's cost
index (records written here as the attempts would write them), into the file it names at the end."""

from __future__ import annotations

import importlib.util
import logging
import re
import time
from pathlib import Path
from typing import Any

from airflow_cloudtrain.lifecycle.cost_index import CostRecord, write_record
from airflow_cloudtrain.storage import open_run_folder

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"


def test_the_demo_writes_the_runs_timeline_from_the_cost_index(emu: Any, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("cloudtrain_demo_timeline", DEMO)
    assert spec and spec.loader
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.TIMELINE = tmp_path / "timeline.svg"
    bucket = open_run_folder(demo.load_module("retrain_spot").BUCKET)
    run_id = f"ct-demo-{time.time_ns()}"
    now = time.time()
    for n, (spot, interrupted) in enumerate([(True, True), (True, True), (True, False)]):
        write_record(
            bucket,
            CostRecord(
                "retrain_spot",
                "train",
                "manual__d",
                -1,
                run_id,
                "s3://x",
                "ec2spot",
                f"i-{n}",
                "m5.large",
                1,
                spot,
                "interrupted" if interrupted else "succeeded",
                interrupted,
                now - 300 + 100 * n,
                now - 210 + 100 * n,
                0.01,
                "spot history",
            ),
            logging.getLogger("test"),
        )
    demo.write_timeline({"run_id": run_id})
    svg = demo.TIMELINE.read_text()
    assert re.findall(r'class="ct-bar (\w+)" data-index="(\d)"', svg) == [
        ("spot", "0"),
        ("spot", "1"),
        ("spot", "2"),
    ]
    assert re.findall(r'class="ct-interruption" data-index="(\d)"', svg) == ["0", "1"]
    assert demo.WRITTEN == [demo.TIMELINE]
