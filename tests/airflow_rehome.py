"""Airflow imported by the xdist workers' warm parent, pointed at a worker's own home after the fork.

Why: each of ``make test``'s workers imported Airflow and built the in-process Execution API (Cadwyn's
routers for every API version) before its first ``dag.test()``: about 8 CPU-seconds per worker, six
times on two cores. The warm parent (``worker_zygote``) now does it once, with the xdist controller's
Airflow home; each fork then gets its own home here, before any test module or fixture touches
Airflow's settings or database.

What Airflow derived from its home at import, and how each is moved:

- the configuration's values that name the home (the DB file, the logs and plugins folders, at this
  version): set as ``AIRFLOW__SECTION__KEY`` environment variables, which Airflow's configuration reads
  before its files on every lookup (and the processes a test starts inherit);
- ``AIRFLOW_HOME`` in ``airflow.configuration`` and ``airflow.settings``, and the settings'
  derived globals (``configure_vars``);
- the ORM: the parent made an engine but never connected; it is disposed of and made again for the
  new DB file; and the logging configuration, made again for the new logs folder.
"""

from __future__ import annotations

import os
import sys


def rehome(home: str) -> bool:
    """Point the Airflow this process already imported at ``home``; False if Airflow was not imported
    (a worker started plain imports it after ``conftest`` set its home) or is there already."""
    if "airflow.settings" not in sys.modules:
        return False
    from airflow import configuration, settings

    old = configuration.AIRFLOW_HOME
    if old == home:
        return False
    parsers = [configuration.conf]
    if "airflow.sdk.configuration" in sys.modules:
        parsers.append(sys.modules["airflow.sdk.configuration"].conf)
    for parser in parsers:
        for section, options in parser.as_dict(display_sensitive=True).items():
            for key, value in options.items():
                if isinstance(value, str) and old in value:
                    os.environ.setdefault(
                        f"AIRFLOW__{section.upper()}__{key.upper()}", value.replace(old, home)
                    )
    configuration.AIRFLOW_HOME = settings.AIRFLOW_HOME = home
    settings.dispose_orm()
    settings.configure_vars()
    settings.configure_orm()
    settings.configure_logging()
    return True
