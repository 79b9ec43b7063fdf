"""``airflow_cloudtrain.checkpoint``: the job's side of checkpoint-resume, under the name jobs import.

The code lives in ``contract.checkpoint`` (the stdlib-only floor that ships whole in the agent zip);
this name is the same module object, so ``from airflow_cloudtrain.checkpoint import ...`` keeps
working for every job and DAG written against it.
"""

import sys

from airflow_cloudtrain.contract import checkpoint as _checkpoint

sys.modules[__name__] = _checkpoint
