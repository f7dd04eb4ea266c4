"""Shared by the DAG integration tests (``test_dag.py``, ``test_approval.py``): data
helpers that write histogram rows to Delta with Spark in the streaming job's
``key_histograms`` schema, the ``dag`` / ``data`` fixtures, running the real DAG with
``dag.test`` (parsed afresh per run), and the stand-in for the streaming job that the
verify step needs. Moved here unchanged from ``test_dag.py``.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pendulum
import pytest

REPO = Path(__file__).resolve().parents[2]
N = 4
KEYS = [f"user-{i:04d}" for i in range(300)]
WINDOW = dt.timedelta(minutes=1)
HISTOGRAM_SCHEMA = ("window_start TIMESTAMP, key STRING, count BIGINT, cost DOUBLE, "
                    "state_bytes BIGINT, instance INT, default_instance INT, key_group INT, "
                    "assignment_version BIGINT")
LIVE = pendulum.datetime(2026, 3, 2, 12, 0, tz="UTC")      # logical dates of manual runs
PAST = pendulum.datetime(2026, 2, 1, 0, 0, tz="UTC")       # backfill range start


# ---------------------------------------------------------------- fixtures
def load_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "rebalance.py"))
    assert bag.import_errors == {}
    return bag.dags["rebalance"]


@pytest.fixture(scope="module")
def dag(spark, airflow_db):
    from rebalance.control.inputs import spark_session

    spark_session()  # the DAG's session settings, for the seeding below too
    return load_dag()


@pytest.fixture()
def data(spark, tmp_path, monkeypatch):
    """A fresh data root per test, with assignment version 0 for N instances (what the
    streaming job creates at start)."""
    from rebalance.spark import tables

    monkeypatch.setenv("REBALANCE_DATA_DIR", str(tmp_path / "data"))
    tables.create_assignments(spark, N)
    return tmp_path / "data"


def placement():
    from rebalance.core.placement import default_instances, key_groups

    return default_instances(KEYS, N), key_groups(KEYS)


def traffic(skewed: bool) -> dict[str, int]:
    """Events per window: 10 per key; skewed adds 400 to four keys of instance 0."""
    default, _ = placement()
    counts = dict.fromkeys(KEYS, 10)
    if skewed:
        for key in [k for k, d in zip(KEYS, default) if d == 0][:4]:
            counts[key] += 400
    return counts


def write_windows(spark, starts, counts, version=0, routing=None, splits=None):
    """Histogram rows of closed windows, appended as the streaming job appends them (a
    split key: one row per share, its events spread by the shares)."""
    from rebalance.core.records import as_utc
    from rebalance.spark import tables

    default, group = placement()
    routing, splits = routing or {}, splits or {}
    rows = []
    for start in starts:
        for key, d, g in zip(KEYS, default, group):
            parts = splits.get(key) or {int(routing.get(key, d)): 1.0}
            left = counts[key]
            for j, (instance, share) in enumerate(sorted(parts.items())):
                count = left if j == len(parts) - 1 else round(counts[key] * share)
                left -= count
                rows.append((as_utc(start), key, count, float(count), 232, instance,
                             int(d), int(g), instance, version, 0))
    tables.ensure_table(spark, tables.KEY_HISTOGRAMS)
    tables.append(spark.createDataFrame(rows, tables.KEY_HISTOGRAMS.schema), tables.KEY_HISTOGRAMS)


def interval(dag, logical_date):
    from airflow.serialization.encoders import coerce_to_core_timetable

    return coerce_to_core_timetable(dag.timetable).infer_manual_data_interval(run_after=logical_date)


def seed_interval(spark, dag, logical_date, counts, n_windows=6):
    di = interval(dag, logical_date)
    write_windows(spark, [di.start + i * WINDOW for i in range(n_windows)], counts)
    return di


#: Seconds between two checks of the DAG's waits (``await_restart``, ``verify``) in the
#: tests: the stand-ins answer within a second, the DAG's own 5 and 10 s are for a live job.
TEST_POKE_SECONDS = 1.0


def run_dag(dag, logical_date, conf=None):
    """One manual run with ``dag.test``; the run id depends only on the logical date.

    The DAG is parsed afresh for every run: in-process, Airflow 3.3 writes a run's conf
    into the shared task objects' params, which would leak into the next run. Its waits
    check every :data:`TEST_POKE_SECONDS` (``dag.test`` runs the parsed task objects).
    """
    dag = load_dag()
    for task in dag.tasks:
        if hasattr(task, "poke_seconds"):       # the deferred waits (control.waits)
            task.poke_seconds = TEST_POKE_SECONDS
    dr = dag.test(logical_date=logical_date, run_after=logical_date, run_conf=conf or {})
    return dr, task_states(dr.dag_id, dr.run_id)


def task_states(dag_id, run_id):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id).all()
        return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in tis}


def table_versions(spark):
    """Number of commits of every table the DAG writes."""
    from rebalance.spark import tables
    from rebalance.spark.plan_store import CONTROL, PLAN_ASSIGNMENTS, PLANS

    return {t.name: len(tables.history(spark, t)) if tables.exists(spark, t) else 0
            for t in (PLANS, PLAN_ASSIGNMENTS, tables.ASSIGNMENTS, CONTROL)}


def live_assignment(spark):
    from rebalance.spark import tables

    return tables.read_assignment(spark)


class StandIn(threading.Thread):
    """A background stand-in for a running component: ``prepare()`` once, then ``step()``
    every 0.5 s until the ``with`` block ends; an error in it fails the test at exit."""

    def __init__(self, spark):
        super().__init__(daemon=True)
        # Own SQL conf: the pipeline sets Delta txn confs on the main session.
        self.spark = spark.newSession()
        self.stopped = threading.Event()
        self.error = None

    def prepare(self):
        """Runs once in the thread before the first step."""

    def step(self):
        raise NotImplementedError

    def run(self):
        try:
            self.prepare()
            while not self.stopped.wait(0.5):
                self.step()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.join(timeout=30)
        assert self.error is None, self.error


class JobStandIn(StandIn):
    """Stands in for the streaming job: when a new assignment version is published, it
    processes the next window under that assignment and appends its histogram rows."""

    def __init__(self, spark, first_window, counts):
        super().__init__(spark)
        self.next_window = first_window
        self.counts = counts

    def prepare(self):
        from rebalance.spark import delta_rs, tables

        self.log = tables.ASSIGNMENTS.path()
        self.commits = len(delta_rs.commit_versions(self.log))

    def step(self):
        from rebalance.spark import delta_rs, tables

        now = len(delta_rs.commit_versions(self.log))  # read the table only after a commit
        if now == self.commits:
            return
        self.commits, live = now, tables.read_assignment(self.spark)
        write_windows(self.spark, [self.next_window], self.counts, live.version, live.routing,
                      live.splits)
        self.next_window += WINDOW


class ScopedStandIn(JobStandIn):
    """The stand-in streaming job, writing its windows to ``job``'s tables (a thread does
    not inherit the test's job scope)."""

    def __init__(self, job, *args):
        super().__init__(*args)
        self.job = job

    def run(self):
        from rebalance.core import registry

        with registry.job_scope(self.job):
            super().run()


def run_job_dag(spark, dag, job, conf=None):
    """A job's DAG run for real on skewed windows of the job's own tables: assignment
    version 0 and six windows written, then one manual run (``dag.test``) beside the
    stand-in job, which must apply and verify its plan; the run."""
    from rebalance.core import registry
    from rebalance.spark import tables

    with registry.job_scope(job):
        tables.create_assignments(spark, N)
        di = seed_interval(spark, dag, LIVE, traffic(skewed=True))
    with ScopedStandIn(job, spark, di.end, traffic(skewed=True)):
        dr = dag.test(logical_date=LIVE, run_after=LIVE, run_conf=conf or {})
    states = task_states(dr.dag_id, dr.run_id)
    assert dr.state == "success", states
    assert states["apply"] == "success" and states["verify"] == "success"
    return dr
