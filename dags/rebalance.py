"""
### Rebalance hot keys of a streaming job

One such DAG per job of the registry (`rebalance.toml`, docs/registry.md): the built-in
job's is `rebalance`, another job's `rebalance_<job>`. Every interval (the job's
`schedule`, default every 10 minutes; `REBALANCE_SCHEDULE` overrides) it reads the
per-key histograms the streaming job stored in Delta for the run's data interval,
decides whether the job exceeds its bound `1 + theta` (most of the latest 3 windows, under
the live assignment), chooses a load model and a planning bound `theta_plan` by backtest,
plans on the forecast only when such plans beat keeping the live assignment on held-out
recent windows, checks the plan with Great Expectations, publishes it as a new assignment
version, optionally waits for a person's approval, makes it live, and verifies that the
next window(s) stay within `1 + theta`.

`windows -> detect -> plan -> validate -> publish -> (approve) -> apply -> (await_restart) -> verify`

* A skipped task says why in its log (too few windows or events, within the bound, plans
  that would not hold: "backtested realised 1.49 vs 1.46 staying").
* A plan failing validation is stored as **rejected** and the run fails; nothing is applied.
* **Backfill** runs store what-if plans only; the live assignment is never touched.
* Re-running any task gives the same plan id and adds no Delta version.
* Audit trail: `rebalance history`; undo: `rebalance rollback --to-version V`.

The work is library code: `rebalance.control` (params, inputs, tasks, rollout).
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, TriggerRule, dag, task

from rebalance.control import inputs, jobs, rollout, tasks
from rebalance.control import params as run_params
from rebalance.control.waits import RolloutWait, WindowsWait
from rebalance.core.registry import JobConfig

SENSOR_TIMEOUT = dt.timedelta(minutes=run_params.MAX_WAIT_MINUTES + 10)


def rebalance_dag(job: JobConfig):
    """The DAG of ``job``: its id, schedule and Params defaults from the registry; every
    task runs on the job's tables (``jobs.run_as``)."""

    @dag(
        dag_id=job.dag_id,
        schedule=run_params.timetable(job.schedule),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        params={name: Param(**spec) for name, spec in jobs.params_schema(job).items()},
        default_args={"retries": 2,
                      "retry_delay": dt.timedelta(seconds=inputs.retry_delay_seconds())},
        tags=["rebalance", f"job:{job.name}"],
        doc_md=__doc__,
    )
    def rebalance():
        _tasks(job)

    return rebalance()


def _tasks(job: JobConfig) -> None:
    windows = WindowsWait(
        task_id="windows", job=job, poke_seconds=inputs.wait_poll_seconds(),
        timeout=SENSOR_TIMEOUT,
        doc_md="Pick the stored histogram windows of this run's data interval and pin their "
               "Delta version, waiting on the triggerer for a starting or lagging job; skip "
               "when there are too few valid windows or events.")

    @task
    def detect(windows: dict) -> dict:
        """`trigger_rule` theta: most of the latest 3 windows exceed 1 + theta under the live
        assignment (mldc: imbalance > 1.5, enough events, no plan live in the last 3
        periods); skip when within the bound unless `force`."""
        return jobs.run_as(job, tasks.detect, windows)

    @task
    def plan(detected: dict) -> dict:
        """Choose the load model and theta_plan by backtest on the windows before the latest
        third; skip unless a plan made that way beats keeping the live assignment on that
        held-out third by `min_backtest_gain` (or `force`). Then plan with `method` on the
        forecast at theta_plan and store it as proposed."""
        return jobs.run_as(job, tasks.plan, detected)

    @task
    def validate(planned: dict) -> dict:
        """Great Expectations gate: every key once, instances in range, no nulls,
        imbalance <= 1 + theta, migration and table size within bounds. Failing plans
        are stored as rejected and this task fails."""
        return jobs.run_as(job, tasks.validate, planned)

    @task
    def publish(validated: dict) -> dict:
        """Store the plan's assignment as a new assignment version (a what-if plan for
        backfill runs and dry-run), with dag, run, plan and metrics in the Delta commit."""
        return jobs.run_as(job, tasks.publish, validated)

    @task.branch
    def approval_gate(published: dict) -> str:
        """Ask a person when `require_approval` is set, else go straight to apply."""
        return ("approve" if jobs.run_as(job, tasks.needs_approval, published)
                else "no_approval_needed")

    approve = ApprovalOperator(
        task_id="approve",
        subject="Apply rebalance plan {{ ti.xcom_pull(task_ids='publish')['plan']['plan_id'] }}?",
        body=("{% set p = ti.xcom_pull(task_ids='publish')['plan'] %}"
              "**{{ p.method }}** plan `{{ p.plan_id }}` over assignment "
              "v{{ p.base_assignment_version }}: imbalance {{ '%.3f' % p.imbalance_before }} "
              "-> {{ '%.3f' % p.predicted_imbalance }} predicted"
              "{% if p.backtested_imbalance is not none %} ({{ '%.3f' % p.backtested_imbalance }}"
              " backtested on held-out windows, load model {{ p.load_model }}, theta_plan "
              "{{ p.theta_plan }}){% endif %}; {{ p.moved_keys }} key(s) "
              "move ({{ '%.2f' % (100 * p.migration_fraction) }} % of the state).\n\n"
              "Loads before and after, moved keys, validation and Delta commits: "
              "[Rebalance view](/rebalance/plans/{{ p.plan_id }})."),
        defaults="Reject",
        response_timeout=dt.timedelta(hours=1),
        doc_md="Approve to make the published assignment version live; reject (or no answer "
               "within an hour) leaves the live assignment as it is.",
    )
    no_approval_needed = EmptyOperator(task_id="no_approval_needed")

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def apply(published: dict) -> dict:
        """Make the published version live (live switch, or controlled restart when
        state must move), under the apply lease; never for backfill or what-if plans."""
        return jobs.run_as(job, rollout.apply, published)

    # Deferred waits (rebalance.control.waits): checked once in the task, then on the
    # triggerer every few seconds, so no worker slot is held while the job restarts or the
    # next windows arrive. Their timeout lies beyond the longest wait the Params allow: the
    # check's own deadline (restart_timeout_minutes, verify_timeout_minutes) rolls back or
    # marks the plan diverged first.
    def waits(applied):
        restarted = RolloutWait(
            task_id="await_restart", check="await_restart", payload=applied, job=job,
            poke_seconds=inputs.wait_poll_seconds(),
            timeout=SENSOR_TIMEOUT,
            doc_md="apply_mode restart: wait for the streaming job to stop, migrate the moved "
                   "keys' state and acknowledge the new version; on failure or timeout restore "
                   "the previous version and fail. Passes through at once for a live switch.")
        verified = RolloutWait(
            task_id="verify", check="verify", payload=restarted.output, job=job,
            poke_seconds=inputs.wait_poll_seconds(),
            timeout=SENSOR_TIMEOUT,
            doc_md="Wait for the next window(s) under the new assignment and record the "
                   "realised imbalance on the plan; fail when it exceeds 1 + theta + "
                   "`verify_tolerance`.")
        return restarted >> verified

    published = publish(validate(plan(detect(windows.output))))
    approval_gate(published) >> [approve, no_approval_needed]
    applied = apply(published)
    [approve, no_approval_needed] >> applied
    waits(applied)


for _job in jobs.jobs():
    rebalance_dag(_job)
