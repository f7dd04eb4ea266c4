"""``make demo``: the rebalancing pipeline end to end on local Spark, Delta and Airflow.

On a fresh data root (``.data/demo``) the event generator appends batches from a
background thread, the keyed streaming job runs in this process, and the ``rebalance`` DAG
runs several times with real Airflow (``dag.test``, on an Airflow home of its own), each
run over the latest minute of event time; the demo paces the generator just ahead of the
DAG, then prints each applied plan's imbalance and migration, the audit trail, and a plot
of instance loads. The steps and settings: ``docs/streaming.md``, "The whole path locally".
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rebalance.spark.paths import REPO_ROOT, data_dir

INSTANCES = 4
INTERVAL = dt.timedelta(seconds=60)      # the DAG's data interval (REBALANCE_SCHEDULE)
WINDOW_SECONDS = 10                      # one generator batch = one histogram window
BATCHES_PER_INTERVAL = int(INTERVAL.total_seconds()) // WINDOW_SECONDS
RUNS = 5                                 # DAG runs, one per minute of event time
RUN_CONF = {"method": "mixed", "theta": 0.1, "verify_windows": 2, "min_windows": 3}


@dataclass
class Outcome:
    """What one DAG run did."""

    run_id: str
    interval: tuple[dt.datetime, dt.datetime]
    state: str
    skipped: list[str] = field(default_factory=list)
    plan: object | None = None


class SkipLog(logging.Handler):
    """Collects the skip reasons the task library logs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("skipped: "):
            self.reasons.append(message.removeprefix("skipped: "))


class Feeder(threading.Thread):
    """Appends generator batches up to ``target``; once the job runs a new assignment
    version (``running_version``) it raises the target by ``after_switch`` batches (the
    windows verification waits for)."""

    def __init__(self, spark, generator, after_switch: int,
                 running_version: Callable[[], int]) -> None:
        super().__init__(daemon=True, name="generator")
        self.spark = spark.newSession()  # own SQL conf, apart from the DAG's Delta commits
        self.generator = generator
        self.after_switch = after_switch
        self.running_version = running_version
        self.next_batch = 0
        self.target = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from rebalance.streaming.generator import append_batches

        newest = self.running_version()
        try:
            while not self.stopped.is_set():
                now = self.running_version()
                if now != newest:
                    newest = now
                    self.target = max(self.target, self.next_batch + self.after_switch)
                if self.next_batch < self.target:
                    append_batches(self.spark, self.generator, [self.next_batch])
                    self.next_batch += 1
                    self.stopped.wait(0.5)
                else:
                    self.stopped.wait(0.5)
        except BaseException as exc:  # noqa: BLE001 - reported by the demo
            self.error = exc


def main() -> None:
    root = data_dir() / "demo"
    _configure(root)
    from rebalance.cli import audit
    from rebalance.control.inputs import spark_session
    from rebalance.spark import tables
    from rebalance.streaming.builtin import start_job
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig

    started = time.monotonic()
    print(f"demo data in {root} (fresh), with its own Airflow home "
          f"{os.environ['AIRFLOW_HOME']} (the service's, for `make up`, is not touched)")
    spark = spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    t0 = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=30)).replace(second=0, microsecond=0)
    gen_config = GeneratorConfig(
        n_keys=200, zipf=1.0, events_per_batch=1500, batch_seconds=WINDOW_SECONDS,
        fluctuation=1.0, interval_batches=3 * BATCHES_PER_INTERVAL, n_instances=INSTANCES,
        seed=10, start=t0.isoformat().replace("+00:00", "Z"))
    generator = EventGenerator(gen_config)
    tables.create_assignments(spark, INSTANCES)
    append_batches(spark, generator, [0])
    job = start_job(spark, JobConfig(n_instances=INSTANCES, window_seconds=WINDOW_SECONDS,
                                     n_windows=3, watermark_seconds=0, trigger_seconds=2,
                                     name="keyed"))   # the job the DAG controls
    job.follow_in_background()    # takes each plan the DAG applies
    feeder = Feeder(spark, generator, after_switch=RUN_CONF["verify_windows"] + 2,
                    running_version=lambda: job.rebalanced.version)
    feeder.next_batch = 1
    feeder.start()
    print(f"generator and streaming job running ({INSTANCES} instances, {WINDOW_SECONDS} s "
          f"windows, event time from {t0:%H:%M}); DAG runs every {INTERVAL.seconds} s of event time\n")
    skips = SkipLog()
    logging.getLogger("rebalance.control").addHandler(skips)
    logging.getLogger("rebalance.control").setLevel(logging.INFO)
    outcomes = []
    try:
        for k in range(RUNS):
            end = t0 + (k + 1) * INTERVAL
            feeder.target = max(feeder.target, (k + 1) * BATCHES_PER_INTERVAL + 1)
            _wait_for_window(spark, end - dt.timedelta(seconds=WINDOW_SECONDS), feeder)
            skips.reasons.clear()
            outcomes.append(_run_dag(end, skips))
            _report(len(outcomes), outcomes[-1])
    finally:
        feeder.stopped.set()
        feeder.join(timeout=60)
        job.stop()
    if feeder.error:
        raise RuntimeError(f"generator failed: {feeder.error}") from feeder.error
    _summary(outcomes)
    png = plot_instance_loads(spark, root / "instance_loads.png", outcomes)
    print(f"\ninstance loads over time: {png}\n")
    audit.history(argparse.Namespace(limit=12, json=False))
    print(f"\n(full audit trail: REBALANCE_DATA_DIR={root} rebalance history --limit 0)")
    print(f"demo finished in {time.monotonic() - started:.0f} s")


def _configure(root: Path) -> None:
    """Environment of the demo, set before Spark or Airflow are imported: a fresh data
    root and a fresh Airflow home inside it (the demo's DAG runs are its own, never in the
    service's history), and PySpark's per-query worker lines kept off the console."""
    from rebalance.ops.service import quiet_python_workers

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    os.environ["REBALANCE_DATA_DIR"] = str(root)
    os.environ["REBALANCE_SCHEDULE"] = f"{int(INTERVAL.total_seconds())}s"
    os.environ["AIRFLOW_HOME"] = str(root / "airflow")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO_ROOT / "dags"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("REBALANCE_SPARK_CONF", "spark.ui.enabled=false")
    os.environ.setdefault("REBALANCE_SPARK_LOG_LEVEL", "ERROR")
    # the Python workers of the job's Spark inherit this process's environment
    os.environ.update(quiet_python_workers(dict(os.environ), root / "logs" / "python-worker.log"))
    logging.getLogger("py4j").setLevel(logging.WARNING)
    _migrate_airflow_db(root / "airflow")


def _migrate_airflow_db(home: Path) -> None:
    """Create the demo's Airflow metadata database (SQLite, about 6 s)."""
    import subprocess
    import sys

    home.mkdir(parents=True)
    log = home / "db-migrate.log"
    with log.open("wb") as out:
        rc = subprocess.call([str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
                             stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    if rc != 0:
        raise RuntimeError(f"airflow db migrate failed (exit {rc}) in {home}; see {log}")


def _wait_for_window(spark, window_start: dt.datetime, feeder: Feeder, timeout: float = 300) -> None:
    """Block until the job wrote the histogram of the window starting at ``window_start``."""
    from pyspark.sql import functions as F

    from rebalance.spark import tables

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if feeder.error:
            raise RuntimeError(f"generator failed: {feeder.error}") from feeder.error
        if tables.exists(spark, tables.KEY_HISTOGRAMS):
            latest = tables.read(spark, tables.KEY_HISTOGRAMS).agg(F.max("window_start")).first()[0]
            if latest is not None and latest.replace(tzinfo=dt.timezone.utc) >= window_start:
                return
        time.sleep(2)
    raise TimeoutError(f"no histogram for the window at {window_start} after {timeout:.0f} s")


def _run_dag(end: dt.datetime, skips: SkipLog) -> Outcome:
    import pendulum
    from airflow.dag_processing.dagbag import DagBag

    from rebalance.spark.plan_store import PlanStore

    # Parsed afresh for each run: in-process, a run's conf would leak into the next run
    # through the shared task objects (Airflow 3.3 dag.test).
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags" / "rebalance.py")).dags["rebalance"]
    logical = pendulum.instance(end)
    dr = dag.test(logical_date=logical, run_after=logical, run_conf=RUN_CONF)
    from rebalance.control.inputs import spark_session

    plan = PlanStore(spark_session()).find_for_run(dag.dag_id, dr.run_id)
    return Outcome(dr.run_id, (end - INTERVAL, end), str(getattr(dr.state, "value", dr.state)),
                   list(skips.reasons), plan)


def _report(n: int, o: Outcome) -> None:
    span = f"{o.interval[0]:%H:%M:%S}-{o.interval[1]:%H:%M:%S}"
    if o.plan is None:
        why = o.skipped[0] if o.skipped else f"run {o.state}"
        print(f"run {n} [{span}] skipped: {why}")
        return
    p = o.plan
    m = p.metrics
    realised = f"{p.realised_imbalance:.3f}" if p.realised_imbalance is not None else "n/a"
    print(f"run {n} [{span}] plan {p.plan_id} ({p.method}) {p.status}"
          + (f", assignment v{p.assignment_version}" if p.assignment_version else ""))
    print(f"    imbalance before {m['imbalance_before']:.3f} -> predicted "
          f"{p.predicted_imbalance:.3f} -> realised {realised}")
    print(f"    migration: {m['moved_keys']} keys, {m['migration_bytes']:.0f} bytes "
          f"({100 * m['migration_fraction']:.1f}% of state), routing table {m['table_size']} keys")
    if p.status == "rejected":
        print("    rejected: " + "; ".join(p.reasons))


def _summary(outcomes: list[Outcome]) -> None:
    applied = [o.plan for o in outcomes if o.plan is not None and o.plan.assignment_version]
    print(f"\n{len(outcomes)} DAG runs: {len(applied)} plan(s) applied, "
          f"{sum(o.plan is None for o in outcomes)} run(s) skipped")
    for p in applied:
        print(f"  v{p.assignment_version}: imbalance {p.metrics['imbalance_before']:.3f} -> "
              f"{p.realised_imbalance if p.realised_imbalance is None else round(p.realised_imbalance, 3)}"
              f" realised (predicted {p.predicted_imbalance:.3f}), moved "
              f"{p.metrics['moved_keys']} keys ({100 * p.metrics['migration_fraction']:.1f}% of state)")


def plot_instance_loads(spark, path: Path, outcomes: list[Outcome]) -> Path:
    """Events per instance per window, with the assignment switches and the imbalance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates
    import matplotlib.pyplot as plt
    import pandas as pd

    from rebalance.core.model import imbalance
    from rebalance.spark import tables

    pdf = (tables.read(spark, tables.INSTANCE_HISTOGRAMS)
           .groupBy("window_start", "instance").agg({"events": "sum", "assignment_version": "max"})
           .toPandas().rename(columns={"sum(events)": "events", "max(assignment_version)": "version"}))
    loads = pdf.pivot_table(index="window_start", columns="instance", values="events",
                            fill_value=0).sort_index()
    versions = pdf.groupby("window_start")["version"].max().sort_index()
    ratio = pd.Series(imbalance(loads.to_numpy()), index=loads.index)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1.4]})
    for instance in loads.columns:
        top.plot(loads.index, loads[instance], marker=".", label=f"instance {instance}")
    bottom.plot(ratio.index, ratio, color="black", marker=".", label="max / mean")
    bottom.axhline(1.5, color="red", linestyle=":", label="trigger: MLDC 0.5")
    bottom.axhline(1 + RUN_CONF["theta"], color="green", linestyle=":", label="1 + theta")
    changes = versions[versions.diff().fillna(0) > 0]
    for when, version in changes.items():
        for ax in (top, bottom):
            ax.axvline(when, color="grey", linestyle="--")
        top.annotate(f"v{int(version)}", (when, loads.to_numpy().max()), fontsize=9)
    for o in outcomes:
        bottom.axvspan(o.interval[0], o.interval[1], alpha=0.06, color="blue")
    top.set_ylabel("events per window")
    top.set_title("Instance loads over time (dashed: a new assignment version goes live)")
    top.legend(loc="upper right", fontsize=8)
    bottom.set_ylabel("imbalance")
    bottom.set_xlabel("window start (event time, UTC)")
    bottom.xaxis.set_major_formatter(matplotlib.dates.DateFormatter("%H:%M"))
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
