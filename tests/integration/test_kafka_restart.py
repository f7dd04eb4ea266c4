"""Controlled restarts of the restartable job reading a real Kafka broker, exactly once.

The broker is the test session's single-node KRaft broker (``kafka_broker`` in
tests/conftest.py); each scenario has a topic of its own. One scenario (the module's
``scenario`` fixture, checked by two tests), while a feeder thread keeps producing
generator batches to the topic (2 partitions):

1. generation 0 (N = 2) reads the topic from its earliest offsets;
2. a plan moving a quarter of the keys, same N: the checkpoint stays, so its Kafka
   offsets go on (the moved keys' state is handed over inside the stream); the driver
   "crashes" right after the old generation stopped past its export and a new driver
   completes the restart from the ``restarts`` table;
3. a scale out to N = 3: a new checkpoint, seeded with the re-keyed state, whose Kafka
   source starts at the old checkpoint's last committed offsets (``startingOffsets``);
   the driver crashes while it writes the migrated state and a new driver completes it;
4. the feeder stops, the job drains.

Results per key and window equal a pandas recomputation of every valid event produced
(none lost, none counted twice), and so do the key and instance histograms of every
closed window.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from restart_helpers import (
    Feeder,
    SimulatedCrash,
    crash_and_recover,
    drain,
    faulty_job,
    publish_moving_plan,
    wait_commits,
)

pytestmark = pytest.mark.slow

TOPIC = "restart-events"
W_MS = 10_000
T0_MS = 1_704_067_200_000
# A generator batch spans 5 s of event time and the watermark lags 10 s: a micro-batch that
# reads part of a batch (the producer writes partition by partition) never makes the
# rest of it late, so every valid event counts (the oracle needs no watermark model).
GEN = dict(n_keys=30, zipf=0.8, events_per_batch=150, batch_seconds=5.0, n_instances=2,
           malformed_fraction=0.02, seed=13)


def _expected(gen, batches) -> pd.DataFrame:
    """Every valid event produced, with its window (relative to T0)."""
    frames = []
    for b in batches:
        g = gen.batch(b)
        ev = g.events[g.malformed.isna().to_numpy()]
        ms = pd.to_datetime(ev.event_time, utc=True).astype("int64") // 1_000_000
        frames.append(pd.DataFrame({"key": ev.key.to_numpy(),
                                    "window": ((ms - ms % W_MS) - T0_MS).to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def _ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def _config(tmp_path, broker, name: str, topic: str):
    """The restartable job on ``topic`` (N = 2, 10 s windows, 10 s watermark)."""
    from rebalance.streaming.job import JobConfig

    return JobConfig(n_instances=2, window_seconds=W_MS / 1000, n_windows=2,
                     watermark_seconds=10, trigger_seconds=0.5, name=name,
                     tables_root=str(tmp_path / "tables"),
                     checkpoint_root=str(tmp_path / "checkpoints"), source="kafka",
                     bootstrap_servers=broker.bootstrap, topic=topic)


def _kafka_offsets(checkpoint: str, batch: int) -> dict:
    """The Kafka offsets (after the batch) a checkpoint logged for ``batch``."""
    return json.loads(Path(checkpoint, "offsets", str(batch)).read_text().splitlines()[2])


def _table(spark, table, root) -> pd.DataFrame:
    from rebalance.spark import tables

    df = tables.read(spark, table, root).toPandas()
    df["window"] = (pd.to_datetime(df.window_start).astype("int64") // 1_000_000
                    - T0_MS).astype("int64")
    return df


@pytest.fixture(scope="module")
def scenario(spark, kafka_broker, tmp_path_factory) -> dict:
    """The restarts of the module docstring, run once; what the tests check."""
    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, produce_batches
    from rebalance.streaming.restart import request_restart

    broker, tmp_path = kafka_broker, tmp_path_factory.mktemp("krestart")
    config = _config(tmp_path, broker, "krestart", TOPIC)
    root = config.tables_root
    gen = EventGenerator(GeneratorConfig(**GEN))
    keys = list(gen.keys)
    produce_batches(spark, gen, range(2), broker.bootstrap, TOPIC)
    job = faulty_job(spark, config)
    job.start()
    feeder = Feeder(lambda b: produce_batches(spark, gen, [b], broker.bootstrap, TOPIC),
                    first=2, period=1.5, limit=10_000)  # no limit: a wait needs new events
    feeder.start()
    generations, requests, during = [job.generation], [], []
    try:
        wait_commits(job, timeout=420.0, feeder=feeder)
        # (a) Same N, a quarter of the keys move; crash right after the old generation
        # stopped past its export.
        p1 = publish_moving_plan(spark, root, keys, 2, ({}, 2), 0.25, "kafka-restart")
        requests.append(request_restart(spark, p1["version"], 2, job=config.name, root=root))
        produced = feeder.next
        job = crash_and_recover(job, "stop", spark, config)
        generations.append(job.generation)
        wait_commits(job, timeout=420.0, feeder=feeder)
        during.append(feeder.next - produced)

        # (b) Scale out to N = 3 (a new checkpoint); crash while the state is written.
        p2 = publish_moving_plan(spark, root, keys, 3, (p1["routing"], 2), 0.25,
                                 "kafka-restart")
        requests.append(request_restart(spark, p2["version"], 3, job=config.name, root=root))
        produced = feeder.next
        job = crash_and_recover(job, "state", spark, config)
        generations.append(job.generation)
        wait_commits(job, timeout=420.0, feeder=feeder)
        during.append(feeder.next - produced)
    finally:
        feeder.halt.set()
        feeder.join()
    assert feeder.error is None, feeder.error
    drain(job)
    job.stop()

    statuses = [job.control.status(r) for r in requests]
    return dict(p1=p1, p2=p2, statuses=statuses, during=during, generations=generations,
                expected=_expected(gen, range(feeder.next)),
                res=_table(spark, tables.RESULTS, root),
                kh=_table(spark, tables.KEY_HISTOGRAMS, root),
                ih=_table(spark, tables.INSTANCE_HISTOGRAMS, root))


def _across(scenario) -> set:
    """The windows open at the same-N restart's export batch (rows on both sides of it)."""
    g1 = scenario["generations"][1]
    export = g1.batch_offset + g1.start_batch - 1
    res, kh = scenario["res"], scenario["kh"]
    return set(res[res.batch_id <= export].window) & set(kh[kh.batch_id >= export].window)


def test_restarts_resume_from_kafka_offsets_exactly_once(scenario):
    p1, p2, statuses = scenario["p1"], scenario["p2"], scenario["statuses"]
    during, generations = scenario["during"], scenario["generations"]
    assert p1["moved"] >= 0.1 and p2["moved"] >= 0.1
    assert [s["state"] for s in statuses] == ["acknowledged", "acknowledged"], statuses
    assert statuses[0]["steps"] == ["requested", "started", "acknowledged"]
    assert statuses[1]["steps"] == ["requested", "stopped", "state_written", "started",
                                    "acknowledged"]
    assert all(d > 0 for d in during), f"no batch produced during a restart: {during}"
    g0, g1, g2 = generations
    assert [g.number for g in generations] == [0, 1, 2]
    assert [g.n_instances for g in generations] == [2, 2, 3]

    # (a) Same N: the checkpoint stays and its Kafka offsets go on from batch to batch.
    assert g1.in_place and g1.checkpoint == g0.checkpoint
    logged = [_kafka_offsets(g1.checkpoint, b) for b in _ids(Path(g1.checkpoint, "commits"))]
    for before, after in zip(logged, logged[1:]):
        assert all(after[TOPIC][p] >= o for p, o in before[TOPIC].items())

    # (b) Another N: the new checkpoint's source starts at the old one's last committed
    # offsets; nothing the old one planned without committing is left in its log.
    last = _ids(Path(g1.checkpoint, "commits"))[-1]
    assert _ids(Path(g1.checkpoint, "offsets"))[-1] == last
    assert g2.source["kafka_offsets"] == _kafka_offsets(g1.checkpoint, last)
    assert g2.checkpoint != g1.checkpoint and g2.batch_offset == g1.batch_offset + last + 1
    assert json.loads(Path(g2.checkpoint, "offsets", "0").read_text().splitlines()[2])

    # Exactly once: every valid event produced counts once in the results.
    expected, res = scenario["expected"], scenario["res"]
    assert not res.duplicated(["batch_id", "key", "window", "instance"]).any()
    pd.testing.assert_series_equal(
        res.groupby(["key", "window"])["events"].sum().sort_index(),
        expected.groupby(["key", "window"]).size().sort_index(), check_names=False)
    assert set(res[res.batch_id >= g2.batch_offset].instance) == {0, 1, 2}

    # Closed windows: key and instance histograms equal the events of the window, except
    # (checked by test_histograms_across_the_same_n_handoff) the windows open at the same-N
    # restart's export batch.
    kh, ih = scenario["kh"], scenario["ih"]
    assert not ih.duplicated(["window", "instance"]).any()
    across = _across(scenario)
    closed = sorted(set(kh.window) - across)
    assert len([w for w in closed if w > max(across, default=0)]) >= 3, (closed, across)
    _check_histograms(expected, kh, ih, closed)


def _check_histograms(expected, kh, ih, windows) -> None:
    want = expected[expected.window.isin(windows)]
    kh, ih = kh[kh.window.isin(windows)], ih[ih.window.isin(windows)]
    pd.testing.assert_series_equal(
        kh.groupby(["key", "window"])["count"].sum().sort_index(),
        want.groupby(["key", "window"]).size().sort_index(), check_names=False)
    pd.testing.assert_series_equal(ih.groupby("window")["events"].sum().sort_index(),
                                   want.groupby("window").size().sort_index(),
                                   check_names=False)


def test_histograms_across_the_same_n_handoff(scenario):
    across = _across(scenario)
    assert across, "no window was open at the export batch"
    _check_histograms(scenario["expected"], scenario["kh"], scenario["ih"], sorted(across))


def _grow_topic(spark, bootstrap: str, topic: str, partitions: int) -> None:
    """Raise the topic's partition count, as an operator does with ``kafka-topics --alter
    --partitions``."""
    from rebalance.streaming.job import kafka_admin

    jvm = spark.sparkContext._jvm
    with kafka_admin(jvm, bootstrap) as admin:
        grow = jvm.java.util.Collections.singletonMap(
            topic, jvm.org.apache.kafka.clients.admin.NewPartitions.increaseTo(partitions))
        admin.createPartitions(grow).all().get(60, jvm.java.util.concurrent.TimeUnit.SECONDS)


def test_a_partition_added_while_the_job_is_stopped_is_read_from_its_start(
        spark, kafka_broker, tmp_path):
    """A scale out whose driver dies after the old generation stopped; before a new driver
    comes, the topic grows from 2 to 3 partitions and events are produced to the new one.
    The new checkpoint starts at the old one's offsets for partitions 0 and 1 and at the
    earliest offset of partition 2 (Spark refuses starting offsets that do not name every
    partition): every event counts once."""
    from pyspark.sql import functions as F

    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, produce_batches
    from rebalance.streaming.job import kafka_partitions
    from rebalance.streaming.restart import RestartableJob, request_restart

    broker, topic = kafka_broker, "grow-events"
    config = _config(tmp_path, broker, "kgrow", topic)
    root = config.tables_root
    gen = EventGenerator(GeneratorConfig(**GEN))
    keys = list(gen.keys)
    produce_batches(spark, gen, range(2), broker.bootstrap, topic)
    assert kafka_partitions(spark, broker.bootstrap, topic) == [0, 1]
    job = faulty_job(spark, config)
    job.start()
    try:
        job.process_all_available()
        plan = publish_moving_plan(spark, root, keys, 3, ({}, 2), 0.25, "kafka-partitions")
        request = request_restart(spark, plan["version"], 3, job=config.name, root=root)
        job.crash.add("stop")
        with pytest.raises(SimulatedCrash, match="stop"):
            job.poll()
    finally:
        job.hard_stop()
    # No driver runs: the topic grows, batch 2 goes to the new partition, batch 3 anywhere.
    _grow_topic(spark, broker.bootstrap, topic, 3)
    assert kafka_partitions(spark, broker.bootstrap, topic) == [0, 1, 2]
    batch2 = spark.createDataFrame(gen.batch(2).events, schema=tables.EVENTS.schema)
    (batch2.select(F.col("key"), F.to_json(F.struct(*batch2.columns)).alias("value"),
                   F.lit(2).alias("partition"))
     .write.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
     .option("topic", topic).save())
    produce_batches(spark, gen, [3], broker.bootstrap, topic)

    job = RestartableJob(spark, config)
    job.start()  # completes the restart from the ``restarts`` table
    try:
        drain(job)
        status = job.control.status(request)
        g = job.generation
    finally:
        job.stop()
    assert status["state"] == "acknowledged", status
    assert g.n_instances == 3 and not g.in_place
    assert set(g.source["kafka_offsets"][topic]) == {"0", "1"}  # what the old one read
    last = _ids(Path(g.checkpoint, "commits"))[-1]
    assert _kafka_offsets(g.checkpoint, last)[topic]["2"] >= len(gen.batch(2).events)

    expected = _expected(gen, range(4))
    res = _table(spark, tables.RESULTS, root)
    assert not res.duplicated(["batch_id", "key", "window", "instance"]).any()
    pd.testing.assert_series_equal(
        res.groupby(["key", "window"])["events"].sum().sort_index(),
        expected.groupby(["key", "window"]).size().sort_index(), check_names=False)
