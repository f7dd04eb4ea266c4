"""The keyed job on a real local Spark standalone cluster (a master and two workers of one core).

The module starts the cluster (``rebalance.cluster.Cluster``) on free ports of 127.0.0.1 in a
temporary folder and stops it at the end (and checks nothing of it is left). The keyed job
runs as ``spark_apps/keyed_job.py --master spark://127.0.0.1:<port>`` (client mode, its
executors on the two workers): results equal a pandas recomputation of the generated events,
instance i runs in partition i, and both workers ran executors of the application.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from service_helpers import free_port

REPO = Path(__file__).resolve().parents[2]
N = 2
W_MS = 10_000
T0_MS = 1_704_067_200_000
GEN = dict(n_keys=20, zipf=1.0, events_per_batch=200, batch_seconds=10.0, n_instances=N,
           malformed_fraction=0.03, seed=5)


def _taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from rebalance.cluster import Cluster, ClusterSettings

    c = Cluster(ClusterSettings(dir=tmp_path_factory.mktemp("cluster"), port=free_port(),
                                memory="1500m"), out=lambda _: None)
    c.up()
    try:
        yield c
    finally:
        from rebalance.service import alive

        records = c.service.records()
        c.down()
        assert records and not any(alive(r) for r in records.values())
        assert not _taken(c.s.port)


@pytest.mark.slow
def test_keyed_job_on_the_standalone_cluster(spark, cluster, tmp_path):
    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches

    root = str(tmp_path / "tables")
    gen = EventGenerator(GeneratorConfig(**GEN))
    append_batches(spark, gen, range(4), root)
    argv = [sys.executable, str(REPO / "spark_apps" / "keyed_job.py"), "--master",
            cluster.master_url, "--instances", str(N), "--window-seconds", "10", "--windows", "2",
            "--watermark-seconds", "5", "--name", "ct", "--tables-root", root,
            "--checkpoint-root", str(tmp_path / "ck"),
            "--conf", "spark.executor.memory=1g", "--conf", "spark.cores.max=2"]
    log = tmp_path / "job.log"
    with log.open("wb") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=900,
                              env=dict(os.environ, PYSPARK_PYTHON=sys.executable), cwd=str(REPO))
    assert proc.returncode == 0, log.read_text()[-3000:]

    frames = []
    for b in range(4):
        g = gen.batch(b)
        frames.append(g.events[g.malformed.isna().values])
    exp = pd.concat(frames)
    ms = pd.to_datetime(exp.event_time).astype("int64") // 1_000_000 - T0_MS
    exp = exp.assign(window=(ms // W_MS) * W_MS)
    res = tables.read(spark, tables.RESULTS, root).toPandas()
    res["window"] = pd.to_datetime(res.window_start).astype("int64") // 1_000_000 - T0_MS
    got = res.groupby(["key", "window"])["events"].sum().sort_index()
    pd.testing.assert_series_equal(got, exp.groupby(["key", "window"]).size().sort_index(),
                                   check_names=False)
    assert (res.partition_id == res.instance).all()
    assert set(res.instance) == set(range(N))
    # Both workers launched executors of the application.
    logs = Path(cluster.s.dir) / "service" / "logs"
    for i in range(2):
        assert "Asked to launch executor" in (logs / f"spark-worker-{i}.log").read_text()
