"""Two jobs in one registry, their DAGs run for real (``dag.test``, Spark, Delta, Great
Expectations): each DAG plans, publishes, applies and verifies on its own job's tables
only, and a plan of one job is never applied to another's."""

from __future__ import annotations

import pytest
from dag_helpers import (
    LIVE,
    REPO,
    TEST_POKE_SECONDS,
    N,
    interval,
    run_job_dag,
)

pytestmark = pytest.mark.slow

REGISTRY = """
[jobs.keyed]
dag_id = "rebalance"
tables = "tables"

[jobs.clicks]
app = "sessions"
tables = "jobs/clicks/tables"
theta = 0.1
apply_mode = "broadcast"
"""


@pytest.fixture()
def two_jobs(spark, airflow_db, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from rebalance.control.inputs import spark_session
    from rebalance.core import registry

    path = tmp_path / "rebalance.toml"
    path.write_text(REGISTRY)
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    monkeypatch.setenv("REBALANCE_DATA_DIR", str(tmp_path / "data"))
    spark_session()
    bag = DagBag(dag_folder=str(REPO / "dags" / "rebalance.py"))
    assert bag.import_errors == {}
    assert {"rebalance", "rebalance_clicks"} <= set(bag.dags)
    for dag in bag.dags.values():
        for task in dag.tasks:
            if hasattr(task, "poke_seconds"):
                task.poke_seconds = TEST_POKE_SECONDS
    reg = registry.load()
    return bag.dags, reg.job("keyed"), reg.job("clicks"), tmp_path / "data"


def test_each_jobs_dag_plans_and_applies_on_its_own_tables_only(two_jobs, spark):
    from rebalance.control import inputs, jobs, rollout, tasks
    from rebalance.control.errors import InvalidParams
    from rebalance.core import registry
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PLANS, PlanStore

    dags, keyed, clicks, data = two_jobs
    dag = dags["rebalance_clicks"]
    assert dag.params["apply_mode"] == "broadcast" and "job:clicks" in dag.tags
    tables.create_assignments(spark, N)                  # the built-in job's, untouched
    dr = run_job_dag(spark, dag, clicks, {"method": "milp"})
    assert tables.ASSIGNMENTS.path() == str(data / "tables" / "assignments")

    with registry.job_scope(clicks):
        assert tables.tables_root() == data / "jobs" / "clicks" / "tables"
        (plan,) = PlanStore(spark).plans()
        assert plan.status == "verified" and plan.dag_id == "rebalance_clicks"
        assert tables.read_assignment(spark).metadata["plan_id"] == plan.plan_id
        # the same run's tasks again, to hold the published payload in hand
        conf = {"method": "milp", "apply_mode": "broadcast"}
        windows = inputs.read_windows(conf, dr.dag_id, dr.run_id, "manual",
                                      dr.data_interval_start, dr.data_interval_end)
        published = tasks.publish(tasks.validate(tasks.plan(tasks.detect(windows))))
    assert published["plan"]["plan_id"] == plan.plan_id
    # the built-in job's tables: no plan, the assignment it started with
    assert not tables.exists(spark, PLANS)
    assert tables.read_assignment(spark).version == 0

    # clicks' plan, handed to the built-in job's tasks: refused, nothing written
    before = len(tables.history(spark, tables.ASSIGNMENTS))
    with pytest.raises(InvalidParams, match="belongs to job 'clicks'; the DAG of job "
                                            "'keyed' never plans, publishes or applies"):
        jobs.run_as(keyed, rollout.apply, {**published, "job": "clicks"})
    with pytest.raises(Exception, match=plan.plan_id):    # a payload stripped of its job
        jobs.run_as(keyed, rollout.apply, published)
    assert len(tables.history(spark, tables.ASSIGNMENTS)) == before
    assert tables.read_assignment(spark).version == 0
    assert interval(dags["rebalance"], LIVE) == interval(dag, LIVE)
