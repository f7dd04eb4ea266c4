"""Table maintenance on real Delta tables while a writer keeps appending, as the streaming
job does: old histogram rows expire except the windows a stored plan names, OPTIMIZE
compacts, VACUUM keeps time travel to the plan's input version, the log is checkpointed,
and every other row is there exactly once. Then one real run of the maintenance DAG.

Small on purpose (a few hundred rows, a dozen files): the module runs in about a minute
on the shared 2-core machine.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from pathlib import Path

import pendulum
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KEYS = [f"user-{i:03d}" for i in range(8)]
FIRST = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
#: 40 windows, 6 h apart (10 days): with a retention of 3 days, 27 are older than the cutoff.
WINDOWS = [FIRST + i * dt.timedelta(hours=6) for i in range(40)]
PLANNED = WINDOWS[4:6]          # a plan's input windows, older than the retention
VERIFIED = WINDOWS[8]           # the window its verification measured
RETENTION_DAYS = 3


def histogram_rows(windows, batch):
    return [(w, k, 10 + i, 10.0 + i, 232, i % 4, i % 4, i, i % 4, 0, batch)
            for w in windows for i, k in enumerate(KEYS)]


def as_rows(df):
    return Counter(tuple(r) for r in df.collect())


@pytest.fixture(scope="module")
def store(spark, tmp_path_factory):
    """A data root with key_histograms written in a dozen files, and one stored plan whose
    input windows and version are pinned as the rebalance DAG pins them."""
    from rebalance.core.records import PlanRecord
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PLANS

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REBALANCE_DATA_DIR", str(tmp_path_factory.mktemp("maintenance") / "data"))
        schema = tables.KEY_HISTOGRAMS.schema
        # the older windows in ten files of one commit, then the newest one appended alone
        tables.append(spark.createDataFrame(histogram_rows(WINDOWS[:-1], 0), schema)
                      .repartition(10), tables.KEY_HISTOGRAMS)
        tables.append(spark.createDataFrame(histogram_rows(WINDOWS[-1:], 1), schema)
                      .coalesce(1), tables.KEY_HISTOGRAMS)
        version = tables.history(spark, tables.KEY_HISTOGRAMS, limit=1)[0].version
        plan = PlanRecord(
            plan_id="p-maintenance", status="proposed", method="mixed", dag_id="rebalance",
            run_id="manual__x", run_type="manual",
            inputs={"windows": [w.isoformat() for w in PLANNED],
                    "key_histograms_version": int(version)},
            verification={"windows": [VERIFIED.isoformat()]})
        tables.append(spark.createDataFrame([plan.to_row()], PLANS.schema), PLANS)
        yield {"version": int(version), "path": tables.KEY_HISTOGRAMS.path()}


class Appender(threading.Thread):
    """Appends one recent histogram window per commit, as the job's idempotent sink does
    (one Delta transaction per batch), until stopped."""

    def __init__(self, spark, limit=3):
        super().__init__(daemon=True)
        self.spark, self.limit = spark.newSession(), limit
        self.stopped, self.rows, self.error = threading.Event(), [], None

    def run(self):
        from rebalance.spark import tables

        try:
            for batch in range(100, 100 + self.limit):
                if self.stopped.is_set():
                    break
                rows = histogram_rows([WINDOWS[-1] + dt.timedelta(minutes=batch)], batch)
                tables.append(self.spark.createDataFrame(rows, tables.KEY_HISTOGRAMS.schema)
                              .coalesce(1), tables.KEY_HISTOGRAMS, txn=("job:key_histograms", batch))
                self.rows += rows
                self.stopped.wait(1.0)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_maintenance_keeps_plan_windows_and_every_row_while_the_job_appends(spark, store):
    from rebalance.core.records import as_utc
    from rebalance.spark import maintenance as m

    path = store["path"]
    before = as_rows(spark.read.format("delta").load(path))
    assert sum(before.values()) == 40 * len(KEYS)
    params = {"histograms_retention_days": RETENTION_DAYS,
              "tables": ["key_histograms", "assignments"]}
    def data_files() -> set:
        return {f.relative_to(path) for f in Path(path).rglob("*.parquet")
                if "_delta_log" not in f.parts}
    files_before = data_files()
    appender = Appender(spark)
    appender.start()
    started = time.monotonic()
    try:
        figures = m.run_all(spark, params)
    finally:
        appender.stopped.set()
        appender.join(timeout=60)
    took = time.monotonic() - started
    assert appender.error is None, appender.error
    expire, optimize = figures["expire"]["key_histograms"], figures["optimize"]["key_histograms"]
    vacuum, checkpoint = figures["vacuum"]["key_histograms"], figures["checkpoint"]["key_histograms"]
    print(f"\nmaintenance of key_histograms in {took:.1f} s, {len(appender.rows)} rows "
          f"appended meanwhile: {expire}\n{optimize}\n{vacuum}\n{checkpoint}")

    # expire: every row older than newest - 3 days is gone, except the plan's windows
    cutoff = WINDOWS[-1] - dt.timedelta(days=RETENTION_DAYS)
    assert expire["cutoff"] == cutoff.isoformat() and expire["protected_windows"] == 3
    kept = set(PLANNED) | {VERIFIED}
    expired = Counter({r: n for r, n in before.items() if as_utc(r[0]) < cutoff
                       and as_utc(r[0]) not in kept})
    assert expire["rows_deleted"] == sum(expired.values()) == (27 - 3) * len(KEYS)
    # every remaining row identical, each appended row once: nothing lost, nothing doubled
    after = as_rows(spark.read.format("delta").load(path))
    appended = Counter((r[0].replace(tzinfo=None), *r[1:]) for r in appender.rows)  # as read
    assert appender.rows and after == before - expired + appended
    assert {as_utc(r[0]) for r in after if as_utc(r[0]) < cutoff} == kept

    # optimize: fewer files; Z-ordered by window_start
    assert optimize["zorder_by"] == "window_start"
    assert optimize["files_after"] < optimize["files_before"], optimize
    # vacuum within the retention deletes no file a version of the last 7 days needs
    assert vacuum["retention_hours"] == 168 and vacuum["files_deleted"] == 0
    # (the appender may add a file while vacuum runs: no file goes, some may come)
    assert vacuum["files_on_disk_after"] >= vacuum["files_on_disk_before"]
    assert files_before <= data_files()
    # the plan's input version still reads, row for row, as it was pinned
    pinned = spark.read.format("delta").option("versionAsOf", store["version"]).load(path)
    assert as_rows(pinned) == before
    # the log is checkpointed at the version maintenance left
    assert checkpoint["mode"] == "explicit" and checkpoint["checkpoint_version"] == vacuum["version"]
    assert Path(path, "_delta_log", f"{vacuum['version']:020d}.checkpoint.parquet").is_file() or \
        checkpoint["version"] > vacuum["version"]  # (the appender may have committed after it)
    # assignments are never vacuumed (nor optimized), plans never expired
    assert figures["vacuum"]["assignments"]["skipped"].startswith("every assignment version")
    assert m.expire(spark, "plans")["skipped"] == "never expired"


def test_bad_retention_is_refused_before_anything_is_written(spark, store):
    from rebalance.spark import maintenance as m
    from rebalance.spark import tables

    version = tables.history(spark, tables.KEY_HISTOGRAMS, limit=1)[0].version
    for params, message in (({"histograms_retention_days": -1}, "must be within"),
                            ({"vacuum_retention_hours": 1}, "safety check"),
                            ({"tables": ["key_histogram"]}, "unknown table 'key_histogram'")):
        with pytest.raises(m.MaintenanceParamError, match=message):
            m.run_all(spark, params)
    assert tables.history(spark, tables.KEY_HISTOGRAMS, limit=1)[0].version == version


def test_the_maintenance_dag_runs_every_step(spark, store, airflow_db):
    """One real run (``dag.test``, in-process) on the plans table only: the figures are the
    first test's; this checks the wiring, the session and the Params of the DAG."""
    from airflow.dag_processing.dagbag import DagBag
    from dag_helpers import task_states

    from rebalance.spark import tables
    from rebalance.spark.plan_store import PLANS

    bag = DagBag(dag_folder=str(REPO / "dags" / "maintenance.py"))
    assert bag.import_errors == {}
    dag = bag.dags["rebalance_maintenance"]
    when = pendulum.datetime(2026, 3, 2, 3, 0, tz="UTC")
    dr = dag.test(logical_date=when, run_after=when, run_conf={"tables": ["plans"]})
    states = task_states(dr.dag_id, dr.run_id)
    assert dr.state == "success", states
    assert states == dict.fromkeys(("expire", "optimize", "vacuum", "checkpoint"), "success")
    commits = [c.metadata for c in tables.history(spark, PLANS, limit=4)]
    assert {"kind": "maintenance", "step": "vacuum", "table": "plans",
            "retention_hours": 168} in commits  # the history says what maintenance did
    assert Path(PLANS.path(), "_delta_log", "_last_checkpoint").is_file()


def test_the_jobs_events_stream_runs_on_past_an_expiry_and_liveness_skips_maintenance(
        spark, tmp_path, monkeypatch):
    """What lets the maintenance DAG run daily beside the job:

    * the job's Delta stream of ``events`` (``read_events``, as the job and a restart
      generation build it) goes on past the DELETE that expires old events. It delivers
      each event appended after the DELETE once, and none of the rows the DELETE rewrote
      (they were delivered before). A plain Delta stream stops at that commit: the control
      below shows this;
    * a maintenance commit on ``results`` does not make a stopped job look alive."""
    from rebalance.control import rollout
    from rebalance.spark import tables
    from rebalance.streaming.job import JobConfig, read_events

    root = str(tmp_path / "tables")
    monkeypatch.setenv("REBALANCE_DATA_DIR", str(tmp_path))
    old, new = "2026-01-01T00:00:00", "2026-01-09T00:00:00"

    def events(ids, when):
        return spark.createDataFrame([(f"e{i}", f"k{i % 3}", "1", "1", when) for i in ids],
                                     tables.EVENTS.schema)
    # one file of old events only, one of old and new events mixed (the DELETE rewrites it)
    tables.append(events(range(0, 4), old).unionByName(events(range(4, 8), new))
                  .repartition(1).union(events(range(8, 12), old).coalesce(1)), tables.EVENTS,
                  root)
    seen: list[str] = []

    def drain(reader_df, checkpoint):
        (reader_df.writeStream.foreachBatch(
            lambda df, _: seen.extend(r.event_id for r in df.select("event_id").collect()))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
         .start().awaitTermination(120))

    config = JobConfig(tables_root=root)
    drain(read_events(spark, config), tmp_path / "cp")
    assert sorted(seen) == sorted(f"e{i}" for i in range(12))
    path = tables.EVENTS.path(root)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE event_time < '2026-01-05'")
    deleted_at = tables.history(spark, tables.EVENTS, root, limit=1)[0]
    assert deleted_at.operation == "DELETE"
    tables.append(events(range(12, 16), new), tables.EVENTS, root)
    seen.clear()
    drain(read_events(spark, config), tmp_path / "cp")
    assert sorted(seen) == [f"e{i}" for i in range(12, 16)]  # once each, nothing re-read
    # the control: without skipping change commits, the stream stops at the DELETE
    with pytest.raises(Exception, match="DELETE|skipChangeCommits|ignoreChanges"):
        drain(spark.readStream.format("delta").option("startingVersion", deleted_at.version)
              .load(path), tmp_path / "cp-plain")

    # liveness: a job commit ages past the limit, then OPTIMIZE (maintenance) commits
    monkeypatch.setenv("REBALANCE_JOB_STALE_SECONDS", "5")
    row = [(1, 0, dt.datetime(2026, 1, 9), "k0", 0, 0, 1, 1, 1.0, 1, 1.0, None)]
    for batch in (1, 2):  # two files, so that OPTIMIZE has work
        tables.append(spark.createDataFrame(row, tables.RESULTS.schema), tables.RESULTS,
                      metadata={"job": "keyed", "batch_id": batch})
    assert rollout.job_down_reason(spark) is None
    time.sleep(6)
    spark.sql(f"OPTIMIZE {tables.sql_name(tables.RESULTS)}")
    assert tables.history(spark, tables.RESULTS, limit=1)[0].operation == "OPTIMIZE"
    reason = rollout.job_down_reason(spark)
    assert reason is not None and "its last results commit is" in reason, reason
    tables.append(spark.createDataFrame(row, tables.RESULTS.schema), tables.RESULTS,
                  metadata={"job": "keyed", "batch_id": 3})
    assert rollout.job_down_reason(spark) is None
