"""``make demo`` prints its story, and Airflow's own lines go to the log file (scripts/demo.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from dag_helpers import write_dag

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"


def test_the_terminal_gets_the_story_and_the_log_file_the_rest(airflow_db, tmp_path) -> None:
    """In a process of its own, as ``make demo`` runs: a DAG run's Airflow INFO lines, its task's print
    and a child process's output go to the log file; the terminal shows the story lines only."""
    log = tmp_path / "demo.log"
    write_dag(
        textwrap.dedent(
            """
            from datetime import datetime
            from airflow.sdk import DAG, task

            with DAG("demo_quiet", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
                @task
                def chatty() -> int:
                    print("a task's own print")
                    return 42

                chatty()
            """
        ),
        "demo_quiet",
    )
    code = textwrap.dedent(
        f"""
        import importlib.util, subprocess, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        spec = importlib.util.spec_from_file_location("cloudtrain_demo", {str(DEMO)!r})
        demo = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(demo)
        log = Path({str(log)!r})
        with demo.quiet_to(log):
            from dag_helpers import load_example
            demo.say("story: before the run")
            run = load_example("demo_quiet").test()
            subprocess.run([sys.executable, "-c", "print('a child process line')"], check=True)
            demo.say(f"story: the run {{run.state}}")
            demo.show_log_tail(log, lines=3)
        print("after the block")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:2] == ["story: before the run", "story: the run success"], done.stdout[-3000:]
    assert lines[2].startswith("  --- the last 3 lines of") and lines[-2:] == ["  ---", "after the block"]
    assert len(lines) == 8, done.stdout[-3000:]  # the story, the tail asked for, and stdout back after
    written = log.read_text()
    assert "[DAG TEST] running task" in written  # Airflow's own INFO lines are in the file
    assert "a task's own print" in written and "a child process line" in written
