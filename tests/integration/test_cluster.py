"""The keyed job, a controlled restart and the DAG's Spark work on a real local Spark
standalone cluster (a master and two workers of one core).

The module starts the cluster (``rebalance.ops.cluster.Cluster``) once, on free ports of
127.0.0.1 in a temporary folder, and stops it at the end (and checks nothing of it is
left and its ports are closed). On it:

1. the keyed job (``spark_apps/restartable_job.py``, the service's job), submitted with
   ``spark-submit --master spark://127.0.0.1:<port>`` (the line docs/cluster.md gives),
   with a controlled restart at the same N that moves the hottest keys, requested as the
   DAG requests it (a new assignment version published for ``apply_mode`` restart, then
   ``request_restart``): acknowledged; results equal a pandas recomputation of the
   generated events (malformed ones left out), instance i runs in partition i, both
   workers ran executors of the application, and the sliding counts and sums after the
   restart equal the oracle over all events (the moved keys' state went with them).
   (``spark_apps/keyed_job.py``, the job without restarts, runs as its own process in
   test_kafka.py; a separate cluster submit of it proved nothing this one does not.)
2. a real run of the rebalance DAG (``dag.test``) whose Spark session runs on the cluster
   (``REBALANCE_SPARK_MASTER=spark://...``, in a process of its own: this one holds a
   local SparkContext): the run succeeds, and the master's application list and the
   workers' executor logs show that its work ran on the cluster.

Expectations are recomputed with pandas from the generator (a batch oracle).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from class_data_checks import jvms, unmapped
from service_helpers import Proc, free_port

from rebalance.ops.processes import descendants
from rebalance.spark.class_data import java_options

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
N = 2
W_MS = 10_000
T0_MS = 1_704_067_200_000
RESTART_GEN = dict(n_keys=24, zipf=1.0, events_per_batch=150, batch_seconds=10.0,
                   n_instances=N, malformed_fraction=0.03, seed=7)
JOB_OPTIONS = ["--instances", str(N), "--window-seconds", "10", "--windows", "2",
               "--watermark-seconds", "5"]
TIMEOUT = 420  # a JVM start can take 1-2 min on a loaded machine


def _taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _env(**extra) -> dict[str, str]:
    return dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
                PYTHONUNBUFFERED="1", **extra)


def _spark_submit(master: str) -> list[str]:
    """``spark-submit --master <master> --jars <.jars/*.jar> --conf ...``, as docs/cluster.md
    writes it."""
    jars = ",".join(str(p) for p in sorted((REPO / ".jars").glob("*.jar")))
    return [str(Path(sys.executable).with_name("spark-submit")), "--master", master,
            "--jars", jars, "--conf", f"spark.pyspark.python={sys.executable}",
            "--conf", "spark.executor.memory=1g",
            "--driver-java-options", java_options()]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from rebalance.ops.cluster import Cluster, ClusterSettings

    c = Cluster(ClusterSettings(dir=tmp_path_factory.mktemp("cluster"), port=free_port(),
                                memory="1500m"), out=lambda _: None)
    c.up()
    ui = c.web_ui_port()
    try:
        yield c
    finally:
        from rebalance.ops.service import alive

        records = c.service.records()
        c.down()
        assert records and not any(alive(r) for r in records.values())
        assert not _taken(c.s.port) and (ui is None or not _taken(ui))


def _apps(cluster) -> dict[str, list[dict]]:
    """The master's application list (its web UI's JSON): name -> apps (active and done)."""
    port = cluster.web_ui_port()
    assert port, "no MasterWebUI line in the master's log"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=30) as r:
        state = json.load(r)
    out: dict[str, list[dict]] = {}
    for app in state["activeapps"] + state["completedapps"]:
        out.setdefault(app["name"], []).append(app)
    return out


def _executor_logs(cluster, app_id: str) -> dict[str, str]:
    """Per worker: the stderr of its executors of ``app_id`` (under the workers' work dir)."""
    logs = {}
    for i in range(cluster.s.workers):
        text = cluster.log(f"spark-worker-{i}").read_text(errors="replace")
        execs = [line.split(f"{app_id}/")[1].split()[0] for line in text.splitlines()
                 if f"Asked to launch executor {app_id}/" in line]
        logs[f"worker-{i}"] = "".join(
            (Path(cluster.s.dir) / "work" / app_id / e / "stderr").read_text(errors="replace")
            for e in execs if (Path(cluster.s.dir) / "work" / app_id / e / "stderr").exists())
    return logs


def _ran_on_the_cluster(cluster, name: str, every_worker: bool = True) -> str:
    """The app ``name`` is in the master's application list and its executors ran tasks
    (on each worker, or on some); returns its id."""
    apps = _apps(cluster)
    assert name in apps, sorted(apps)
    app_id = apps[name][-1]["id"]
    logs = _executor_logs(cluster, app_id)
    ran = ["Running task" in text for text in logs.values()]
    assert all(ran) if every_worker else any(ran), {w: t[-1500:] for w, t in logs.items()}
    return app_id


def _window_ms(times: pd.Series) -> pd.Series:
    ms = (pd.to_datetime(times, utc=True) - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(
        milliseconds=1)
    return ms - ms % W_MS - T0_MS


def _oracle(gen, batches) -> pd.DataFrame:
    frames = []
    for b in batches:
        g = gen.batch(b)
        ev = g.events[g.malformed.isna().values]
        frames.append(pd.DataFrame({"key": ev["key"].to_numpy(),
                                    "value": ev["value"].astype(float).to_numpy(),
                                    "window": _window_ms(ev["event_time"]).to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def _results(spark, root) -> pd.DataFrame:
    from rebalance.spark import tables

    res = tables.read(spark, tables.RESULTS, root).toPandas()
    res["window"] = _window_ms(res["window_start"])
    return res


# ------------------------------------------- 1. the keyed job and a controlled restart
def _python_driver(proc: Proc, script: str) -> int | None:
    """The pid of the Python driver spark-submit started (its JVM's child running ``script``)."""
    for pid in proc.group():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(script.encode()) for part in cmd) and b"java" not in cmd[0]:
            return pid
    return None


def _wait(predicate, what: str, proc: Proc, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert proc.alive(), f"the job ended while waiting for {what}:\n{proc.tail(60)}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{proc.tail(40)}"
        time.sleep(1.0)


def test_controlled_restart_on_the_cluster_keeps_the_state(spark, cluster, tmp_path):
    from rebalance.core.placement import default_instances
    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.restart.control import RestartControl, request_restart

    root = str(tmp_path / "tables")
    gen = EventGenerator(GeneratorConfig(**RESTART_GEN))
    append_batches(spark, gen, range(3), root)
    argv = [*_spark_submit(cluster.master_url), str(REPO / "spark_apps" / "restartable_job.py"),
            *JOB_OPTIONS, "--trigger-seconds", "1", "--poll-seconds", "1",
            "--max-files-per-trigger", "1", "--name", "cr", "--tables-root", root,
            "--checkpoint-root", str(tmp_path / "ck")]
    proc = Proc(argv, _env(), tmp_path / "job.log", cwd=REPO)
    batches = lambda: (tables.read(spark, tables.RESULTS, root)  # noqa: E731
                       .select("batch_id").distinct().count()
                       if tables.exists(spark, tables.RESULTS, root) else 0)
    try:
        _wait(lambda: "running" in proc.output(), "generation 0", proc)
        _wait(lambda: batches() >= 2, "two committed batches", proc)
        # Every JVM of the cluster maps the class-data archive: master, workers, executors.
        pids = {p for r in cluster.service.records().values()
                for p in (r.pid, *descendants(r.pid))} | set(proc.group())
        assert {"org.apache.spark.executor.CoarseGrainedExecutorBackend",
                "org.apache.spark.deploy.SparkSubmit"} <= set(jvms(pids).values())
        assert unmapped(pids) == {}
        # A plan for the same N that moves the four hottest keys to the other instance,
        # published as the DAG publishes it for apply_mode restart, then requested.
        keys = list(gen.keys)
        hot = [keys[i] for i in np.argsort(-gen.frequencies(0), kind="stable")[:4]]
        routing = {k: int(1 - d) for k, d in zip(hot, default_instances(hot, N))}
        version = tables.publish_assignment(spark, routing, N,
                                            {"test": "cluster", "apply_mode": "restart"}, root)
        request = request_restart(spark, version, N, job="cr", root=root)
        append_batches(spark, gen, range(3, 5), root)   # events keep coming meanwhile
        control = RestartControl(spark, "cr", root)
        _wait(lambda: control.status(request)["done"], "end of the restart", proc)
        status = control.status(request)
        append_batches(spark, gen, range(5, 7), root)
        exp = _oracle(gen, range(7))
        _wait(lambda: int(tables.read(spark, tables.RESULTS, root).agg({"events": "sum"})
                          .first()[0] or 0) >= len(exp), "all events processed", proc)
        driver = _python_driver(proc, "restartable_job.py")
        if driver:  # KeyboardInterrupt in the driver: the job stops its queries, exits 0
            os.kill(driver, signal.SIGINT)
            proc.popen.wait(timeout=120)
    finally:
        proc.stop()
    assert status["state"] == "acknowledged", (status, proc.tail(60))
    assert status["steps"] == ["requested", "started", "acknowledged"], status  # same N
    # Ctrl-C stopped the query between batches: no batch's Spark job was cancelled inside
    # its foreachBatch (Spark's check of such a failure overflowed the stream thread's stack)
    assert "StackOverflowError" not in proc.output(), proc.tail(80)

    res = _results(spark, root)
    assert not res.duplicated(["batch_id", "key", "window"]).any()
    got = res.groupby(["key", "window"])["events"].sum().sort_index()
    pd.testing.assert_series_equal(got, exp.groupby(["key", "window"]).size().sort_index(),
                                   check_names=False)
    assert (res.partition_id == res.instance).all()
    # Rows after the restart are routed by the new version: the hot keys ran on their new
    # instance, with the state they had on the old one.
    after = res[res.assignment_version == version]
    before = res[res.assignment_version == 0]
    assert len(after) and len(before)
    want = dict(zip(after.key, default_instances(list(after.key), N)))
    want.update(routing)
    assert (after.instance == after.key.map(want)).all()
    assert {k: set(res[res.key == k].instance) for k in hot} == {k: {0, 1} for k in hot}
    # The last row of every (key, window) holds the full running and sliding aggregates
    # (sliding: this window and the one before), recomputed from all events.
    last = res.sort_values("batch_id").groupby(["key", "window"]).last()
    per = exp.groupby(["key", "window"]).agg(n=("value", "size"), s=("value", "sum"))
    prev = per.rename(lambda w: w + W_MS, level="window").reindex(per.index, fill_value=0)
    per, prev = per.reindex(last.index), prev.reindex(last.index)
    assert (last["count"] == per["n"]).all()
    assert np.allclose(last["sum"], per["s"])
    assert (last["sliding_count"] == per["n"] + prev["n"]).all(), last[
        last["sliding_count"] != per["n"] + prev["n"]]
    assert np.allclose(last["sliding_sum"], per["s"] + prev["s"])
    # Among them, windows of moved keys whose sliding aggregate needed the state of
    # before the restart (the window or the one before it had events then).
    assert before.batch_id.max() < after.batch_id.min()
    spanning = [(k, w) for k, w in last.index if k in routing
                and ((before.key == k) & (before.window >= w - W_MS)).any()
                and ((after.key == k) & (after.window == w)).any()]
    assert spanning, "no window of a moved key spans the restart"
    _ran_on_the_cluster(cluster, "restartable_job.py")


# ----------------------------------------------------------------------- 2. the DAG
def test_dag_run_with_its_spark_session_on_the_cluster(cluster, airflow_db, tmp_path):
    out = tmp_path / "dag.json"
    env = _env(REBALANCE_SPARK_MASTER=cluster.master_url,
               REBALANCE_DATA_DIR=str(tmp_path / "data"),
               REBALANCE_SPARK_CONF="spark.ui.enabled=false;spark.executor.memory=1g;"
                                    "spark.cores.max=2")
    proc = Proc([sys.executable, str(Path(__file__).with_name("cluster_dag_run.py")), str(out)],
                env, tmp_path / "dag.log", cwd=REPO)
    try:
        proc.popen.wait(timeout=TIMEOUT)
    finally:
        proc.stop()
    assert proc.popen.returncode == 0 and out.exists(), proc.tail(80)
    report = json.loads(out.read_text())
    assert report["master"] == cluster.master_url and report["app_name"] == "rebalance-dag"
    states = report["states"]
    assert report["run_state"] == "success", states
    assert all(states[t] == "success" for t in ("windows", "detect", "plan", "validate",
                                               "publish", "apply", "verify")), states
    assert report["plans"] == [{"status": "verified", "version": 1}]
    assert report["live_version"] == 1 and report["live_routing_size"] > 0
    # The Delta tables were read and written by the cluster's executors.
    assert len(report["executors"]) == 1 + cluster.s.workers, report["executors"]
    app_id = _ran_on_the_cluster(cluster, "rebalance-dag", every_worker=False)
    assert app_id == report["app_id"]
    assert (tmp_path / "data" / "tables" / "assignments" / "_delta_log").is_dir()
