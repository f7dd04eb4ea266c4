"""
### Roll the live assignment back to an earlier version

Triggered with `job` (a job of the registry, default the first) and `to_version` (from
the Rebalance view's "roll back" button, the Trigger form, or
`airflow dags trigger rebalance_rollback -c '{"job": "keyed", "to_version": 3}'`). It restores
that version's routing table as a **new** assignment version, through the same gate as
every plan: `propose -> validate (Great Expectations) -> publish -> apply`, under the
apply lease, with the audit trail in Delta history. `dry_run` stops after publish (a
what-if plan). Same as `rebalance rollback --to-version V` on the command line.

The work is library code: `rebalance.control` (rollback, tasks, rollout).
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from rebalance.control import jobs, rollout, tasks

JOB_NAMES = [job.name for job in jobs.jobs()]


@dag(
    dag_id="rebalance_rollback",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "job": Param(JOB_NAMES[0], type="string", enum=JOB_NAMES, title="Job",
                     description="The registry's job whose assignment rolls back."),
        "to_version": Param(1, type="integer", minimum=0, title="Assignment version to restore",
                            description="An earlier version of the assignments table."),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Store the rollback as a what-if plan; apply nothing."),
    },
    default_args={"retries": 1, "retry_delay": dt.timedelta(seconds=20)},
    tags=["rebalance"],
    doc_md=__doc__,
)
def rebalance_rollback():
    @task
    def propose(params=None) -> dict:
        """Store the plan that restores `to_version` over the live version."""
        return jobs.run_as(jobs.named(params["job"]), tasks.propose_rollback,
                           int(params["to_version"]), bool(params["dry_run"]))

    @task
    def validate(proposed: dict) -> dict:
        """The Great Expectations gate every plan passes."""
        return jobs.run_as(jobs.named(proposed["job"]), tasks.validate, proposed)

    @task
    def publish(validated: dict) -> dict:
        """Store the plan's assignment as published (or what-if for a dry run)."""
        return jobs.run_as(jobs.named(validated["job"]), tasks.publish, validated)

    @task
    def apply(published: dict) -> dict:
        """Make the restored routing live as a new assignment version (skipped for a dry run)."""
        return jobs.run_as(jobs.named(published["job"]), rollout.apply, published)

    apply(publish(validate(propose())))


rebalance_rollback()
