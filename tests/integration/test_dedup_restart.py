"""Duplicates keep being dropped across controlled restarts that move keys (real Spark,
Delta, RocksDB state; the restartable job, dedup on by default).

Generation 0 (N = 2) processes batches 0..1. A restart with the same N moves a third of
the keys (the checkpoint stays, the moved keys' state, with the event ids they saw, is
handed over inside the stream); then the retries of batches 0..1 (same ``event_id``,
sent again by a producer) arrive with batch 2. A restart to N = 3 moves keys again (a new
checkpoint seeded with the migrated state); then the retries of batches 0..2 arrive with
batches 3..5. Every retry is within the watermark (30 s), so every one must be dropped,
including those of keys that moved since their original was counted, and counted in
``instance_histograms.duplicates`` by the instance its key has when the retry comes
(per window, it stays with that instance number through the scale-out).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from restart_helpers import instances, publish_moving_plan

pytestmark = pytest.mark.slow

W_MS = 10_000
T0_MS = 1_704_067_200_000
GEN = dict(n_keys=30, zipf=0.8, events_per_batch=120, batch_seconds=10.0, n_instances=2,
           seed=23)
RETRY = 0.15


def _window(frame: pd.DataFrame) -> pd.Series:
    ms = pd.to_datetime(frame["event_time"], utc=True).astype("int64") // 1_000_000
    return ms - ms % W_MS - T0_MS


def _retries(gen, batch: int) -> pd.DataFrame:
    events = gen.batch(batch).events
    rng = np.random.default_rng([7, batch])
    return events[rng.random(len(events)) < RETRY]


def test_retries_of_events_seen_before_a_restart_are_dropped_after_it(spark, tmp_path):
    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig
    from rebalance.streaming.restart import RestartableJob, request_restart

    root = str(tmp_path / "tables")
    config = JobConfig(n_instances=2, window_seconds=W_MS / 1000, n_windows=2,
                       watermark_seconds=30, max_files_per_trigger=2, trigger_seconds=0.5,
                       name="ddr", tables_root=root, checkpoint_root=str(tmp_path / "ck"))
    assert config.dedup
    gen = EventGenerator(GeneratorConfig(**GEN))
    keys = list(gen.keys)

    def send_retries(batches):
        again = pd.concat([_retries(gen, b) for b in batches], ignore_index=True)
        tables.append(spark.createDataFrame(again, tables.EVENTS.schema).coalesce(1),
                      tables.EVENTS, root)
        return again

    append_batches(spark, gen, range(2), root)
    job = RestartableJob(spark, config)
    job.start()
    try:
        job.process_all_available()
        # Restart 1: same N, a third of the keys move (state handed over in the stream).
        p1 = publish_moving_plan(spark, root, keys, 2, ({}, 2), 0.34, "dedup-restart")
        v1, routing1, moved1 = p1["version"], p1["routing"], p1["moved_keys"]
        r1 = request_restart(spark, v1, 2, job=config.name, root=root)
        job.poll()
        assert job.control.status(r1)["ok"] and job.generation.in_place
        first = send_retries(range(2))
        append_batches(spark, gen, [2], root)
        job.process_all_available()
        # Restart 2: scale out to N = 3 (a new checkpoint seeded with the migrated state).
        p2 = publish_moving_plan(spark, root, keys, 3, (routing1, 2), 0.34, "dedup-restart")
        v2, routing2, moved2 = p2["version"], p2["routing"], p2["moved_keys"]
        r2 = request_restart(spark, v2, 3, job=config.name, root=root)
        job.poll()
        assert job.control.status(r2)["ok"] and not job.generation.in_place
        second = send_retries(range(3))
        append_batches(spark, gen, range(3, 6), root)
        job.process_all_available()
    finally:
        job.stop()
    # The retries include keys that moved after their originals were counted.
    assert moved1 & set(first.key) and moved2 & set(second.key)

    sent = pd.concat([gen.batch(b).events for b in range(6)], ignore_index=True)
    results = tables.read(spark, tables.RESULTS, root).toPandas()
    results["window"] = (pd.to_datetime(results["window_start"]).astype("int64") // 1_000_000
                         - T0_MS)
    got = results.groupby(["key", "window"])["events"].sum().sort_index()
    want = sent.assign(window=_window(sent)).groupby(["key", "window"]).size().sort_index()
    pd.testing.assert_series_equal(got, want, check_names=False)     # every event once

    ih = tables.read(spark, tables.INSTANCE_HISTOGRAMS, root).toPandas()
    ih["window"] = pd.to_datetime(ih["window_start"]).astype("int64") // 1_000_000 - T0_MS
    closed = set(ih["window"])
    assert {0, 10_000} <= closed         # the watermark (max event time - 30 s) is past 20 s
    retried = pd.concat([
        first.assign(instance=instances(first.key, routing1, 2)),
        second.assign(instance=instances(second.key, routing2, 3))], ignore_index=True)
    retried = retried.assign(window=_window(retried))
    want_dups = (retried.astype({"instance": "int64", "window": "int64"})
                 [retried.window.isin(closed)].groupby(["instance", "window"]).size())
    got_dups = (ih.astype({"instance": "int64", "window": "int64"})
                .groupby(["instance", "window"])["duplicates"].sum().astype("int64"))
    want_dups = want_dups.rename(index=int)
    assert set(want_dups.index) <= set(got_dups.index)
    pd.testing.assert_series_equal(got_dups, want_dups.reindex(got_dups.index, fill_value=0),
                                   check_names=False, check_dtype=False)
    assert got_dups.sum() == len(retried[retried.window.isin(closed)]) > 0
