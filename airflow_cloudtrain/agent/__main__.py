"""``python -m airflow_cloudtrain.agent``: see ``airflow_cloudtrain.agent.cli``."""

from __future__ import annotations

from airflow_cloudtrain.agent.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
