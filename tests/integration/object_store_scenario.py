"""Run by ``test_object_store.py`` in a pytest process of its own (its Spark JVM starts
with the S3A JARs, which the registry it is given asks for): a job whose tables live on
the S3-compatible server the outer test started. Not collected by the suite itself."""

from __future__ import annotations

import os

import pytest
from dag_helpers import REPO, TEST_POKE_SECONDS, N, run_job_dag

BUCKET_ROOT = "s3a://rebalance-test/jobs/clicks/tables"


def test_a_jobs_dag_plans_applies_and_verifies_on_object_store_tables(spark, airflow_db,
                                                                     capsys):
    from airflow.dag_processing.dagbag import DagBag

    from rebalance.cli import main
    from rebalance.control.inputs import spark_session
    from rebalance.core import registry
    from rebalance.spark import delta_rs, tables
    from rebalance.spark.plan_store import PLANS, PlanStore

    assert "local:" in spark.conf.get("spark.jars")  # the S3A JARs: the registry asked
    spark_session()
    bag = DagBag(dag_folder=str(REPO / "dags" / "rebalance.py"))
    assert bag.import_errors == {}
    dag = bag.dags["rebalance_clicks"]
    for task in dag.tasks:
        if hasattr(task, "poke_seconds"):
            task.poke_seconds = TEST_POKE_SECONDS
    reg = registry.load()
    clicks, mirror = reg.job("clicks"), reg.job("mirror")

    with registry.job_scope(clicks):
        assert tables.ASSIGNMENTS.path() == f"{BUCKET_ROOT}/assignments"
    run_job_dag(spark, dag, clicks, {"method": "milp"})   # Spark writes the windows to S3

    with registry.job_scope(clicks):
        (plan,) = PlanStore(spark).plans()
        assert plan.status == "verified" and plan.dag_id == "rebalance_clicks"
        live = tables.read_assignment(spark)
        assert live.version == 1 and live.metadata["plan_id"] == plan.plan_id
        # the same tables through delta-rs alone, on the object store
        assert delta_rs.log_version(PLANS.path()) >= 1
        assert delta_rs.log_ident(tables.ASSIGNMENTS.path())[0] >= 1
        assert delta_rs.max_value(tables.KEY_HISTOGRAMS.path(), "window_start") is not None
    data = os.environ["REBALANCE_DATA_DIR"]
    assert not os.path.exists(os.path.join(data, "jobs", "clicks")), "written to the disk"

    capsys.readouterr()
    assert main(["--job", "clicks", "history", "--limit", "3"]) == 0   # no JVM: delta-rs
    assert plan.plan_id in capsys.readouterr().out

    # a job whose tables are a file:// URI: the same folder as the path it names
    with registry.job_scope(mirror):
        root = tables.tables_root()
        tables.create_assignments(spark, N)
    assert str(root) == os.path.join(data, "mirror-tables")
    assert delta_rs.log_version(f"file://{root}/assignments") == 0
    assert main(["--job", "mirror", "status"]) == 0
    assert "live assignment: version 0, N = 4" in capsys.readouterr().out


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__]))
