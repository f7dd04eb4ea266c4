"""
### Delta table maintenance of the rebalancer

Daily at 03:00 UTC by default, while the streaming job keeps appending;
`REBALANCE_MAINTENANCE_SCHEDULE` (a cron expression or preset, or `none` for manual runs
only) changes it:

`expire -> optimize -> vacuum -> checkpoint`, each over the tables of every job of the
registry (`rebalance.toml`); a job's `retention` there overrides the run's for that job.

* **expire** deletes histogram rows older than `histograms_retention_days` (14) and
  results older than `results_retention_days` (7), counted back from the newest window;
  events only when `events_retention_days` is set. Windows a stored plan planned or was
  verified on are never deleted. Plans, plan frames, assignments and restarts never expire.
* **optimize** compacts small files, Z-ordered by `window_start` (data skipping) where the
  table has that column.
* **vacuum** deletes the files a table stopped using more than `vacuum_retention_hours`
  (168 = Delta's default) ago; time travel to any plan's input version works within it.
* **checkpoint** writes a Delta log checkpoint at each table's latest version.

Each task returns its figures per table (rows deleted, files before and after, versions).
A Delta write conflict with the job is retried on a fresh snapshot; a table that fails
does not stop the others. What is kept for how long: docs/maintenance.md.

The work is library code: `rebalance.spark.maintenance`.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from rebalance.control import inputs, jobs
from rebalance.control.errors import InvalidParams
from rebalance.spark import maintenance


def run(step: str, params) -> dict:
    """One maintenance step over every job's tables (``{job: {table: figures}}``) on the
    DAG's Spark session; bad params fail at once (checked before Spark starts), without a
    retry."""
    try:
        checked = {job.name: (job, maintenance.MaintenanceParams.parse({
            **params, **{f"{kind}_retention_days": days for kind, days in job.retention.items()}}))
            for job in jobs.jobs()}
        spark = inputs.spark_session()
        return {name: jobs.run_as(job, maintenance.run_step, spark, step, job_params)
                for name, (job, job_params) in checked.items()}
    except maintenance.MaintenanceParamError as exc:
        raise InvalidParams(f"invalid maintenance params: {exc}") from None


@dag(
    dag_id=maintenance.DAG_ID,
    schedule=maintenance.schedule(),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={name: Param(**spec) for name, spec in maintenance.PARAMS_SCHEMA.items()},
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=1)},
    tags=["rebalance", "ops"],
    doc_md=__doc__,
)
def rebalance_maintenance():
    @task
    def expire(params=None) -> dict:
        """Delete histogram, results (and, when set, event) rows older than their retention,
        except the windows any stored plan names as its input or verification windows."""
        return run("expire", params)

    @task
    def optimize(params=None) -> dict:
        """Compact each table's small files; Z-order by window_start where it has one."""
        return run("optimize", params)

    @task
    def vacuum(params=None) -> dict:
        """Delete files replaced more than `vacuum_retention_hours` ago (not assignments)."""
        return run("vacuum", params)

    @task
    def checkpoint(params=None) -> dict:
        """Write a Delta log checkpoint at each table's latest version."""
        return run("checkpoint", params)

    expire() >> optimize() >> vacuum() >> checkpoint()


rebalance_maintenance()
