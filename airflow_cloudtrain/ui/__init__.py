"""The Cloud training page in Airflow's UI: an Airflow plugin (``ui.plugin``) whose FastAPI app
(``ui.app``) lists the runs the bucket's cost index knows, with their costs and a timeline per run.

The top floor, beside the command line: nothing of the package imports it, and Airflow loads it only
through the ``airflow.plugins`` entry point (the api-server builds the app; other processes only see
the plugin's small class). ``ui.runs`` groups the cost index's records into runs (what the page and
its JSON API show); ``ui.timeline`` draws a run's attempts as SVG (the page and ``make demo``).
"""
