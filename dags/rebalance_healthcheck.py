"""Checks that an Airflow worker can run Spark with Delta the way the rebalancer does."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


@dag(
    dag_id="rebalance_healthcheck",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["rebalance", "ops"],
    doc_md=__doc__,
)
def rebalance_healthcheck():
    @task
    def delta_round_trip() -> dict:
        """Write a Delta table twice with commit metadata and read its history back."""
        from rebalance.control.healthcheck import delta_round_trip as run

        result = run()
        return {"path": result.path, "rows": result.rows, "versions": result.versions}

    delta_round_trip()


rebalance_healthcheck()
