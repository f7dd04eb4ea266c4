"""Airflow local settings of this project (Airflow imports this module in every process;
the plugins folder is on its ``sys.path``).

Only the scheduler acts on it: before its LocalExecutor forks worker processes, it imports
the task library and its heavy dependencies once (pandas, numpy, the Spark Connect
client, Great Expectations, :mod:`rebalance.control`). Every task process is a fork of
such a worker, so it starts with them imported instead of paying 5-10 s of imports per
task (the same idea as Airflow's own ``parsing_pre_import_modules`` for DAG parsing).
Other Airflow processes (api-server, dag-processor, triggerer, the CLI) are untouched.
``REBALANCE_PRELOAD=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

PRELOAD = (
    "pandas", "numpy", "pyarrow", "pyspark.sql.connect.session", "great_expectations",
    "great_expectations.expectations", "rebalance.control.tasks", "rebalance.control.rollout",
    "rebalance.control.validation", "rebalance.core.planners", "rebalance.streaming.restart",
)


def _is_scheduler() -> bool:
    return len(sys.argv) > 1 and sys.argv[1] == "scheduler" and "airflow" in os.path.basename(sys.argv[0])


def _preload() -> None:
    import importlib
    import logging

    log = logging.getLogger(__name__)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a preload is an optimisation only
            log.warning("preload of %s failed: %s", name, exc)


if _is_scheduler() and os.environ.get("REBALANCE_PRELOAD", "1") != "0":
    _preload()
