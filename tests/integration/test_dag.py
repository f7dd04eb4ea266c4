"""The rebalance DAG, run for real: Airflow 3 ``dag.test`` in-process on SQLite, Delta tables
written by Spark, the planning core, and the Great Expectations gate.

Histogram windows are seeded with Spark in the streaming job's ``key_histograms`` schema;
for the verify step a small stand-in for the streaming job watches the ``assignments``
table and, when a version is published, writes the next window processed under it (as
the job does, from its next micro-batch on). Backfill runs are created by Airflow's own
backfill code (what ``airflow backfill create`` calls) and executed in-process by the
same loop ``dag.test`` uses, since ``dag.test`` itself only makes manual runs.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from dag_helpers import (  # noqa: F401 - dag, data are fixtures
    LIVE,
    PAST,
    WINDOW,
    JobStandIn,
    N,
    dag,
    data,
    interval,
    live_assignment,
    run_dag,
    seed_interval,
    table_versions,
    task_states,
    traffic,
    write_windows,
)

pytestmark = pytest.mark.slow


# -------------------------------------------------------------------- tests
def test_invalid_params_fail_before_any_work(dag, data, spark):
    from airflow.sdk.definitions.param import ParamValidationError

    from rebalance.control.errors import InvalidParams
    from rebalance.control.params import RunParams

    for conf, message in (
        ({"theta": -1}, "theta"),
        ({"method": "fastest"}, "method"),
        ({"apply_mode": "yolo"}, "apply_mode"),
        ({"lookback_windows": 0}, "lookback_windows"),
    ):
        with pytest.raises(ParamValidationError, match=message):
            dag.test(logical_date=LIVE, run_after=LIVE, run_conf=conf)
    assert table_versions(spark)["plans"] == 0  # nothing was read or written
    # Consistency across params is checked by the first task before it reads anything.
    with pytest.raises(InvalidParams, match=r"min_windows \(9\) exceeds lookback_windows \(6\)"):
        RunParams.parse({"min_windows": 9, "lookback_windows": 6})
    assert RunParams.parse({"apply_mode": "restart"}).apply_mode == "restart"  # issue 6
    dr, states = run_dag(dag, LIVE, {"min_windows": 9, "lookback_windows": 6})
    assert states["windows"] == "failed" and states["detect"] == "upstream_failed"
    assert dr.state == "failed"


def test_balanced_and_thin_intervals_are_skipped(dag, data, spark):
    from rebalance.control.errors import RunSkipped
    from rebalance.control.inputs import read_windows
    from rebalance.spark.plan_store import PlanStore

    di = seed_interval(spark, dag, LIVE, traffic(skewed=False))
    dr, states = run_dag(dag, LIVE)
    assert dr.state == "success", states
    assert states["windows"] == "success" and states["detect"] == "skipped"
    assert {states[t] for t in ("plan", "validate", "publish", "apply", "verify")} == {"skipped"}

    later = LIVE + dt.timedelta(minutes=30)
    seed_interval(spark, dag, later, traffic(skewed=True), n_windows=1)
    dr, states = run_dag(dag, later)
    assert dr.state == "success" and states["windows"] == "skipped"
    with pytest.raises(RunSkipped, match="too few valid windows: 1 with events"):
        ldi = interval(dag, later)
        read_windows({}, "rebalance", "x", "manual", ldi.start, ldi.end)
    assert PlanStore(spark).plans() == []  # no plan stored
    assert di.end <= later


@pytest.fixture(scope="module")
def skewed_run(dag, spark, tmp_path_factory):
    """A skewed interval, planned, validated, published, applied and verified (its data
    root stays current for the tests that use this fixture)."""
    from rebalance.spark import tables

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REBALANCE_DATA_DIR", str(tmp_path_factory.mktemp("skewed") / "data"))
        tables.create_assignments(spark, N)
        di = seed_interval(spark, dag, LIVE, traffic(skewed=True))
        with JobStandIn(spark, di.end, traffic(skewed=True)):
            dr, states = run_dag(dag, LIVE, {"method": "milp"})
        yield dr, states


def test_a_key_above_the_bound_is_split_applied_and_verified(dag, spark, tmp_path,
                                                               monkeypatch):
    from dag_helpers import KEYS

    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore

    monkeypatch.setenv("REBALANCE_DATA_DIR", str(tmp_path / "data"))
    tables.create_assignments(spark, N)
    counts = traffic(skewed=False)
    counts[KEYS[0]] = 3000          # half the events: 2 mean loads, whole it is the floor
    di = seed_interval(spark, dag, LIVE, counts)
    with JobStandIn(spark, di.end, counts):
        dr, states = run_dag(dag, LIVE, {"method": "mixed", "split_keys": True,
                                         "apply_mode": "broadcast"})
    assert dr.state == "success", states
    (plan,) = PlanStore(spark).plans()
    assert plan.status == "verified", plan.reasons
    assert plan.metrics["split_keys"] == 1 and plan.predicted_imbalance <= 1.1 + 1e-9
    assert plan.realised_imbalance <= 1.1 + 1e-9
    live = live_assignment(spark)
    (key, parts), = live.splits.items()
    assert key == KEYS[0] and len(parts) >= 2 and live.metadata["plan_id"] == plan.plan_id


def test_skewed_interval_is_planned_validated_applied_and_verified(skewed_run, spark):
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PLANS, PlanStore

    dr, states = skewed_run
    assert dr.state == "success", states
    assert states["approve"] == "skipped" and states["no_approval_needed"] == "success"
    assert all(states[t] == "success" for t in ("windows", "detect", "plan", "validate",
                                               "publish", "apply", "verify"))
    store = PlanStore(spark)
    (plan,) = store.plans()
    assert plan.status == "verified" and plan.run_id == dr.run_id
    assert plan.metrics["imbalance_before"] > 1.5 >= plan.predicted_imbalance
    assert plan.predicted_imbalance <= 1 + plan.params["theta"] + 1e-9
    assert plan.realised_imbalance == pytest.approx(plan.predicted_imbalance, rel=1e-6)
    assert plan.assignment_version == 1 and plan.apply_mode == "broadcast"
    live = live_assignment(spark)
    assert live.version == 1 and live.metadata["plan_id"] == plan.plan_id
    frame = store.frame(plan.plan_id)
    expected = frame.loc[frame["instance"] != frame["default"]]
    assert live.routing == dict(zip(expected["key"], expected["instance"]))
    # Delta history is the audit log: one annotated commit per step.
    commits = [c.metadata for c in store.history(PLANS)[1:]]
    assert [c["action"] for c in commits] == ["propose", "validate", "publish", "apply", "verify"]
    assert all(c["plan_id"] == plan.plan_id and c["dag_id"] == "rebalance"
               and c["run_id"] == dr.run_id and c["method"] == "milp" for c in commits)
    assert commits[-1]["metrics"]["moved_keys"] == plan.metrics["moved_keys"]
    (publish,) = tables.assignment_history(spark)
    assert publish.version == 1 and publish.metadata["plan_id"] == plan.plan_id
    assert publish.metadata["metrics"]["imbalance_after"] == plan.predicted_imbalance


def test_rerunning_the_run_gives_the_same_plan_and_no_new_delta_version(dag, skewed_run, spark):
    from rebalance.control import inputs, rollout, tasks
    from rebalance.spark.plan_store import PlanStore

    dr, _ = skewed_run
    (first,) = PlanStore(spark).plans()
    before = table_versions(spark)
    again, states = run_dag(dag, LIVE, {"method": "milp"})  # clears and re-runs every task
    assert again.run_id == dr.run_id and again.state == "success", states
    assert table_versions(spark) == before
    (plan,) = PlanStore(spark).plans()
    assert plan.plan_id == first.plan_id and plan.status == "verified"
    # Each task function retried on its own input: same answer, still no new version.
    windows = inputs.read_windows({"method": "milp"}, dr.dag_id, dr.run_id, "manual",
                                  dr.data_interval_start, dr.data_interval_end)
    planned = tasks.plan(tasks.detect(windows))
    assert planned["plan"]["plan_id"] == first.plan_id
    published = tasks.publish(tasks.validate(planned))
    assert rollout.apply(published)["plan"]["status"] == "verified"
    assert table_versions(spark) == before


def test_corrupted_plan_is_rejected_and_never_applied(dag, data, spark, monkeypatch):
    import rebalance.core.planners as planners
    from rebalance.spark.plan_store import PlanStore

    real = planners.get_planner

    class Corrupting:
        """A faulty planner: one key on an instance that does not exist, metrics unchanged.
        Its search (``propose``, which the backtest gate runs) is the real planner's."""

        def __getattr__(self, name):
            return getattr(real("milp"), name)

        def plan(self, problem, params):
            result = real("milp").plan(problem, params)
            result.assignment = result.assignment.copy()
            result.assignment[0] = problem.n_instances
            return result

    monkeypatch.setattr(planners, "get_planner", lambda name: Corrupting())
    seed_interval(spark, dag, LIVE, traffic(skewed=True))
    dr, states = run_dag(dag, LIVE, {"method": "milp"})
    assert dr.state == "failed" and states["validate"] == "failed"
    assert {states[t] for t in ("publish", "apply", "verify")} == {"upstream_failed"}
    (plan,) = PlanStore(spark).plans()
    assert plan.status == "rejected" and plan.assignment_version is None
    text = " ".join(plan.reasons)
    assert "expect_column_values_to_be_between" in text and "'column': 'instance'" in text
    assert "imbalance_after" in text or "moved" in text  # reported metrics no longer hold
    assert live_assignment(spark).version == 0
    assert table_versions(spark)["assignments"] == 1  # created empty, never published


def test_backfill_makes_what_if_plans_and_leaves_the_live_assignment(dag, data, spark):
    from rebalance.spark.plan_store import PlanStore

    for i in range(2):  # two skewed past intervals of the 10-minute schedule
        start = PAST + i * dt.timedelta(minutes=10)
        write_windows(spark, [start + j * WINDOW for j in range(6)], traffic(skewed=True))
    before = table_versions(spark)
    runs = run_backfill(dag, PAST, PAST + dt.timedelta(minutes=10), {"method": "milp"})
    assert len(runs) == 2
    for run_id, states in runs.items():
        assert run_id.startswith("backfill__")
        assert states["publish"] == "success" and states["apply"] == "skipped", states
        assert states["verify"] == "skipped"
    plans = PlanStore(spark).plans()
    assert sorted(p.run_id for p in plans) == sorted(runs)
    assert {p.status for p in plans} == {"what-if"}
    assert all(p.run_type == "backfill" and p.assignment_version is None for p in plans)
    assert all(p.predicted_imbalance < p.metrics["imbalance_before"] for p in plans)
    assert live_assignment(spark).version == 0
    after = table_versions(spark)
    assert after["assignments"] == before["assignments"] == 1


# ----------------------------------------------------------------- backfill
def run_backfill(dag, from_date, to_date, conf):
    """Create a backfill with Airflow's backfill code and run its dag runs in-process."""
    from airflow.models.backfill import Backfill, _create_backfill
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:  # leftovers of earlier sessions in the shared SQLite
        for b in session.query(Backfill).filter_by(dag_id=dag.dag_id, completed_at=None):
            b.completed_at = dt.datetime.now(dt.timezone.utc)
        session.query(DagRun).filter(DagRun.dag_id == dag.dag_id,
                                     DagRun.logical_date >= from_date,
                                     DagRun.logical_date <= to_date).delete()
    backfill = _create_backfill(dag_id=dag.dag_id, from_date=from_date, to_date=to_date,
                                max_active_runs=1, reverse=False, dag_run_conf=conf,
                                triggering_user_name="test", reprocess_behavior=None)
    with create_session() as session:
        run_ids = [r.run_id for r in session.query(DagRun).filter_by(backfill_id=backfill.id)
                   .order_by(DagRun.logical_date)]
    results = {}
    for run_id in run_ids:
        execute_run(dag, run_id)
        results[run_id] = task_states(dag.dag_id, run_id)
    with create_session() as session:
        session.get(Backfill, backfill.id).completed_at = dt.datetime.now(dt.timezone.utc)
    return results


def execute_run(dag, run_id):
    """Run every task of an existing dag run in this process (the loop of ``dag.test``)."""
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    with create_session() as session:
        dr = session.query(DagRun).filter_by(dag_id=dag.dag_id, run_id=run_id).one()
        dr.dag = scheduler_dag
        dr.state = DagRunState.RUNNING
        session.commit()
        deadline = time.monotonic() + 300
        while dr.state == DagRunState.RUNNING and time.monotonic() < deadline:
            session.expire_all()
            schedulable, _ = dr.update_state(session=session)
            for ti in schedulable:
                ti.try_number += 1
                ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            for ti in dr.get_task_instances(state=[TaskInstanceState.SCHEDULED], session=session):
                _run_task(ti=ti, task=dag.task_dict[ti.task_id])
        assert dr.state != DagRunState.RUNNING, f"backfill run {run_id} did not finish"


def test_history_and_rollback_through_the_validated_path(skewed_run, spark, capsys):
    """After the skewed run: `rebalance history` shows it; `rebalance rollback --to-version 0`
    is stored, validated, published and applied as a new version with v0's routing."""
    import argparse

    from rebalance.cli import audit
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore

    parser = argparse.ArgumentParser(prog="rebalance")
    audit.add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rollback", "--to-version", "0"])
    assert args.func(args) == 0
    live = live_assignment(spark)
    assert live.version == 2 and live.routing == {}
    assert live.metadata["rollback_to"] == 0 and live.metadata["method"] == "rollback"
    rollback_plan = PlanStore(spark).get(live.metadata["plan_id"])
    assert rollback_plan.status == "applied" and rollback_plan.validation["evaluated_expectations"] > 0
    assert args.func(args) == 2  # v2 already routes as v0: nothing to restore

    args = parser.parse_args(["history", "--limit", "0"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "v2" in out and "rollback to v0" in out and "<- live" in out
    for action in ("propose", "validate", "publish", "apply", "verify"):
        assert action in out
    assert len(tables.assignment_history(spark)) == 2
