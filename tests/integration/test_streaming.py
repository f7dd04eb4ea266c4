"""The built-in keyed job (``SlidingWindows`` under ``rebalanced()``) on real Spark +
Delta: exactly-once results and histograms, instance i in partition i, a live assignment
switch, quarantine, late events, validation.

One scenario runs once for the module (about a minute and a half on 2 cores):

1. generate batches 0-2; start the job (processing-time trigger) and process them;
2. publish assignment version v1 moving two hot keys and splitting a third over the
   three instances, while the job keeps running; the job takes it (a move at a
   micro-batch boundary);
3. generate batches 3-4 and process them; stop;
4. "crash": delete the last entry of each checkpoint's commit log, so the last
   micro-batch is replayed; append three late events and batch 5; run the job
   again from its checkpoints (availableNow).

Expectations are recomputed with pandas from the generator (independent of Spark).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rebalance.core.placement import default_instances

N = 3          # instances; differs from the session's 4 shuffle partitions on purpose
W_MS = 10_000  # window = one generator batch of event time
N_WINDOWS = 2  # sliding aggregate over the last 2 windows
GEN = dict(n_keys=30, zipf=1.0, events_per_batch=200, batch_seconds=10.0, n_instances=N,
           cost_sigma=0.5, malformed_fraction=0.03, seed=7)
LATE_IDS = ["late-0", "late-1", "late-2"]
T0_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z, the generator's start: windows are relative to it


@dataclass
class Scenario:
    expected: pd.DataFrame      # valid generator events: key, value, cost, window
    malformed: pd.DataFrame     # event_id, kind of the malformed generator events
    moved: dict[str, int]       # key -> instance of assignment v1
    split: dict[str, dict[int, float]]  # key -> {instance: share} of assignment v1
    version: int                # v1
    results: pd.DataFrame
    key_hist: pd.DataFrame
    inst_hist: pd.DataFrame
    quarantine: pd.DataFrame
    watermark_ms: int           # watermark of the last micro-batch (relative to T0_MS)
    late_dropped: int           # numRowsDroppedByWatermark in the second run
    replayed_batch: int         # the keyed batch whose commit was deleted (so replayed)
    rerun_first_batch: int      # the first batch the restarted job ran
    written_before_crash: set[tuple[str, int]]  # (table, batch id) committed before the crash
    commits: dict[str, list[int]]  # table -> batch ids of its commits, in commit order
    final: pd.DataFrame         # window_results


def _expected(gen, batches) -> tuple[pd.DataFrame, pd.DataFrame]:
    ok_frames, bad_frames = [], []
    for b in batches:
        generated = gen.batch(b)
        ok = generated.malformed.isna()
        ev = generated.events[ok]
        ms = (pd.to_datetime(ev["event_time"], utc=True)
              - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
        ok_frames.append(pd.DataFrame({
            "event_id": ev["event_id"].to_numpy(), "key": ev["key"].to_numpy(),
            "value": ev["value"].astype(float).to_numpy(),
            "cost": ev["cost"].astype(float).to_numpy(),
            "window": (ms - ms % W_MS - T0_MS).to_numpy()}))
        bad_frames.append(pd.DataFrame({"event_id": generated.events.loc[~ok, "event_id"],
                                        "kind": generated.malformed[~ok]}))
    return pd.concat(ok_frames, ignore_index=True), pd.concat(bad_frames, ignore_index=True)


def _settle(job, quiet_seconds: float = 2.0, timeout: float = 60.0) -> None:
    """Wait until no micro-batch (e.g. a trailing no-data batch) runs or starts for a while."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        job.process_all_available()
        state = [(q.lastProgress or {}).get("batchId") for q in job.queries]
        busy = any(q.status["isTriggerActive"] for q in job.queries)
        if state == last and not busy:
            return
        last = state
        time.sleep(quiet_seconds)
    raise TimeoutError("the job did not settle")


def _drop_last_commit(checkpoint: str) -> int:
    """Delete the last entry of a checkpoint's commit log; return its batch id."""
    commits = sorted(Path(checkpoint, "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
    return int(commits[-1].name)


def _batch_commits(spark, root) -> dict[str, list[int]]:
    from rebalance.spark import tables

    return {t.name: [c.metadata["batch_id"] for c in reversed(tables.history(spark, t, root))
                     if "batch_id" in c.metadata]
            for t in (tables.RESULTS, tables.KEY_HISTOGRAMS, tables.INSTANCE_HISTOGRAMS,
                      tables.QUARANTINE, tables.WINDOW_RESULTS)}


def _table(spark, table, root) -> pd.DataFrame:
    from pyspark.sql import functions as F

    from rebalance.spark import tables

    df = tables.read(spark, table, root)
    if "window_start" in df.columns:
        df = df.withColumn("window", F.unix_millis("window_start") - T0_MS).drop("window_start")
    return df.toPandas()


@pytest.fixture(scope="module")
def small_delta_snapshots(spark):
    """Delta rebuilds table state with 50 partitions by default: 3-12 s per idempotent
    (txnAppId) append on 2 cores instead of 0.5 s. Runtime setting, restored after."""
    from rebalance.spark.session import session_confs

    with session_confs(spark, {"spark.databricks.delta.snapshotPartitions": "1"}):
        yield


@pytest.fixture(scope="module")
def scenario(spark, small_delta_snapshots, tmp_path_factory) -> Scenario:
    from rebalance.spark import tables
    from rebalance.streaming.builtin import start_job
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig

    root = str(tmp_path_factory.mktemp("tables"))
    config = JobConfig(n_instances=N, window_seconds=W_MS / 1000, n_windows=N_WINDOWS,
                       watermark_seconds=5, max_files_per_trigger=1, trigger_seconds=0.5,
                       name="itest", tables_root=root,
                       checkpoint_root=str(tmp_path_factory.mktemp("checkpoints")))
    gen = EventGenerator(GeneratorConfig(**GEN))
    expected, malformed = _expected(gen, range(6))

    append_batches(spark, gen, range(3), root)
    job = start_job(spark, config)
    job.process_all_available()
    # Switch the two hottest keys to another instance while the job runs.
    hot = expected[expected.window < 3 * W_MS]["key"].value_counts().index[:3]
    moved = {k: int((d + 1) % N) for k, d in zip(hot[:2], default_instances(list(hot[:2]), N))}
    split = {hot[2]: {0: 0.5, 1: 0.3, 2: 0.2}}
    version = tables.publish_assignment(spark, moved, N, {"reason": "test"}, root, splits=split)
    job.process_all_available()     # takes the new version before the next events
    append_batches(spark, gen, range(3, 5), root)
    _settle(job)
    job.stop()

    before = {(t, b) for t, ids in _batch_commits(spark, root).items() for b in ids}
    replayed = _drop_last_commit(config.checkpoint("keyed"))
    _drop_last_commit(config.checkpoint("quarantine"))
    late = spark.createDataFrame(
        [(i, "k1", "1.0", "1.0", "2024-01-01T00:00:05.000Z") for i in LATE_IDS],
        tables.EVENTS.schema)
    tables.append(late, tables.EVENTS, root)
    append_batches(spark, gen, [5], root)
    rerun = start_job(spark, dataclasses.replace(config, trigger_seconds=None))
    rerun.await_termination()

    progress = list(rerun.keyed.recentProgress)
    watermark = max(p["eventTime"]["watermark"] for p in progress)
    watermark_ms = int(dt.datetime.fromisoformat(watermark.replace("Z", "+00:00")).timestamp()
                       * 1000) - T0_MS
    dropped = sum(op.get("numRowsDroppedByWatermark", 0)
                  for p in progress for op in p["stateOperators"])
    return Scenario(expected, malformed, moved, split, version,
                    _table(spark, tables.RESULTS, root), _table(spark, tables.KEY_HISTOGRAMS, root),
                    _table(spark, tables.INSTANCE_HISTOGRAMS, root),
                    _table(spark, tables.QUARANTINE, root), watermark_ms, dropped, replayed,
                    progress[0]["batchId"], before, _batch_commits(spark, root),
                    _table(spark, tables.WINDOW_RESULTS, root))


def _defaults(keys) -> np.ndarray:
    return default_instances(list(keys), N)


@pytest.mark.slow
def test_results_equal_a_batch_recomputation_with_no_loss_and_no_duplicates(scenario):
    res, exp = scenario.results, scenario.expected
    assert not res.duplicated(["batch_id", "key", "window", "instance"]).any()
    # The restart replayed a batch that had written before the crash; nothing was committed twice.
    assert scenario.rerun_first_batch == scenario.replayed_batch
    assert any(b == scenario.replayed_batch for _, b in scenario.written_before_crash)
    for ids in scenario.commits.values():
        assert len(ids) == len(set(ids))
    # Every valid event counted exactly once, across the switch, the replay and the restart.
    got = res.groupby(["key", "window"])["events"].sum()
    want = exp.groupby(["key", "window"]).size()
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
    # The last row of each (key, window, instance) holds the final running aggregates.
    last = res.sort_values("batch_id").groupby(["key", "window", "instance"]).last().reset_index()
    unmoved = last[~last.key.isin([*scenario.moved, *scenario.split])].set_index(
        ["key", "window"])
    sums = exp.groupby(["key", "window"]).agg(count=("value", "size"), sum=("value", "sum"))
    sums = sums.loc[unmoved.index]
    assert (unmoved["count"] == sums["count"]).all()
    assert np.allclose(unmoved["sum"], sums["sum"])
    for (key, window), row in unmoved.iterrows():
        inside = exp[(exp.key == key) & (exp.window > window - N_WINDOWS * W_MS)
                     & (exp.window <= window)]
        assert row["sliding_count"] == len(inside)
        assert row["sliding_sum"] == pytest.approx(inside["value"].sum())


@pytest.mark.slow
def test_every_instance_runs_in_its_own_partition(scenario):
    for frame in (scenario.key_hist, scenario.inst_hist):
        assert (frame["partition_id"] == frame["instance"]).all()
        assert set(frame["instance"]) == set(range(N))
    # the processor's rows name no instance: a split key's parts are merged
    assert scenario.results["instance"].isna().all()


@pytest.mark.slow
def test_new_assignment_version_is_used_from_the_next_batch_on(scenario):
    res = scenario.results
    running = res[~res["final"].astype(bool)]
    before, after = running[running.window < 3 * W_MS], running[running.window >= 3 * W_MS]
    assert set(before["assignment_version"]) == {0}
    assert set(after["assignment_version"]) == {scenario.version}
    kh = scenario.key_hist
    kh_before = kh[kh.window < 3 * W_MS]
    assert (kh_before["instance"] == _defaults(kh_before["key"])).all()
    kh_after = kh[(kh.window >= 3 * W_MS) & ~kh.key.isin(scenario.split)]
    assert set(kh_after["assignment_version"]) == {scenario.version}
    routed = kh_after["key"].map(scenario.moved).fillna(
        pd.Series(_defaults(kh_after["key"]), index=kh_after.index))
    assert (kh_after["instance"] == routed.astype(int)).all()
    # A split key's events stay where they are (its processor declares a merge): on the
    # new instance a moved key's sliding aggregate starts empty, until N_WINDOWS windows
    # after the switch (window_results merges both sides exactly).
    key = next(iter(scenario.moved))
    first = after[(after.key == key) & (after.window == 3 * W_MS)].sort_values("batch_id").iloc[-1]
    assert first["sliding_count"] == first["count"]
    exp = scenario.expected
    two_windows = exp[(exp.key == key) & exp.window.between(2 * W_MS, 3 * W_MS)]
    assert first["sliding_count"] < len(two_windows)


@pytest.mark.slow
def test_a_split_key_spreads_its_events_by_event_id_over_its_shares(scenario):
    from rebalance.core.placement import split_instances, split_points

    (key, parts), = scenario.split.items()
    exp, kh = scenario.expected, scenario.key_hist
    after = exp[(exp.key == key) & (exp.window >= 3 * W_MS)
                & (exp.window + W_MS <= scenario.watermark_ms)]
    want = after.assign(instance=split_instances(
        split_points(after["event_id"].tolist()), list(parts), list(parts.values())))
    want = want.groupby(["window", "instance"]).size()
    got = kh[(kh.key == key) & (kh.window >= 3 * W_MS)].astype({"instance": "int64"}).groupby(
        ["window", "instance"])["count"].sum()
    got = got[got > 0]
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
    # every instance got a part, and the parts follow the shares
    per_instance = want.groupby(level="instance").sum()
    assert set(per_instance.index) == set(parts)
    assert per_instance.idxmax() == 0       # the largest share


@pytest.mark.slow
def test_window_results_hold_one_exact_row_per_closed_window_and_key(scenario):
    final, exp = scenario.final, scenario.expected
    assert not final.duplicated(["window", "key"]).any()
    assert (final.window + W_MS <= scenario.watermark_ms).all()
    closed = exp[exp.window + W_MS <= scenario.watermark_ms]
    want = closed.groupby(["key", "window"]).agg(count=("value", "size"), sum=("value", "sum"))
    got = final.set_index(["key", "window"]).sort_index()
    assert got.index.equals(want.sort_index().index)
    want = want.sort_index()
    assert (got["count"] == want["count"]).all()
    assert np.allclose(got["sum"], want["sum"])
    # the sliding aggregates are exact for every key: moved by the live switch and split too
    for (key, window), row in got.iterrows():
        inside = exp[(exp.key == key) & (exp.window > window - N_WINDOWS * W_MS)
                     & (exp.window <= window)]
        assert row["sliding_count"] == len(inside), (key, window)
        assert row["sliding_sum"] == pytest.approx(inside["value"].sum())
    # the rows of the split key and of the moved keys after the switch are merged parts
    kh = scenario.key_hist
    parts = kh[kh.window >= 3 * W_MS].groupby("key")["instance"].nunique()
    (key, shares), = scenario.split.items()
    assert parts[key] == len(shares)
    assert set(final["assignment_version"]) == {0, scenario.version}


@pytest.mark.slow
def test_histograms_of_closed_windows_sum_to_the_input(scenario):
    kh, ih, exp = scenario.key_hist, scenario.inst_hist, scenario.expected
    closed = exp[exp.window + W_MS <= scenario.watermark_ms]
    assert closed.window.nunique() >= 4
    assert (kh.window + W_MS <= scenario.watermark_ms).all()
    assert not kh.duplicated(["window", "key", "instance"]).any()
    assert not ih.duplicated(["window", "instance"]).any()
    got = kh.groupby(["window", "key"]).agg(count=("count", "sum"), cost=("cost", "sum"))
    want = closed.groupby(["window", "key"]).agg(count=("value", "size"), cost=("cost", "sum"))
    assert got.index.equals(want.index)
    assert (got["count"] == want["count"]).all() and np.allclose(got["cost"], want["cost"])
    per_instance = kh.groupby(["window", "instance"]).agg(
        events=("count", "sum"), load=("cost", "sum"), keys=("key", "size"))
    ih = ih.set_index(["window", "instance"]).loc[per_instance.index]
    assert (ih["events"] == per_instance["events"]).all()
    assert (ih["keys"] == per_instance["keys"]).all()
    assert np.allclose(ih["load"], per_instance["load"])
    assert (ih["task_ms"] > 0).all()
    assert (kh["state_bytes"] >= kh["key"].str.len() + 16 + 32).all()
    assert (kh["default_instance"] == _defaults(kh["key"])).all()


@pytest.mark.slow
def test_late_events_are_dropped_by_the_watermark(scenario):
    assert scenario.late_dropped >= len(LATE_IDS)
    k1_window0 = scenario.results[(scenario.results.key == "k1") & (scenario.results.window == 0)]
    want = scenario.expected
    assert k1_window0["events"].sum() == len(want[(want.key == "k1") & (want.window == 0)])


@pytest.mark.slow
def test_malformed_events_land_in_quarantine_once_with_their_reason(scenario):
    q = scenario.quarantine.set_index("event_id")
    assert q.index.is_unique
    want = scenario.malformed.set_index("event_id")["kind"]
    assert set(q.index) == set(want.index)
    assert (q.loc[want.index, "reason"] == want).all()


@pytest.mark.slow
def test_assignment_versions_read_back_and_an_empty_routing_keeps_a_version(spark, scenario,
                                                                            tmp_path):
    from rebalance.spark import tables

    root = str(tmp_path)
    tables.create_assignments(spark, 2, root)
    assert tables.latest_assignment_version(spark, root) == 0
    v1 = tables.publish_assignment(spark, {"a": 1}, 2, {"plan": "p1"}, root)
    v2 = tables.publish_assignment(spark, {}, 2, {"plan": "reset"}, root)
    assert (v1, v2) == (1, 2)
    assert tables.latest_assignment_version(spark, root) == 2
    latest = tables.read_assignment(spark, root=root)
    assert (latest.version, latest.routing, latest.metadata["plan"]) == (2, {}, "reset")
    old = tables.read_assignment(spark, version=1, root=root)
    assert (old.routing, old.n_instances, old.metadata["table_size"]) == ({"a": 1}, 2, 1)
    assert [c.version for c in tables.assignment_history(spark, root)] == [2, 1]
    with pytest.raises(tables.AssignmentError, match="for 2 instances, not 3"):
        tables.publish_assignment(spark, {"a": 1}, 3, root=root)
    v3 = tables.publish_assignment(spark, {"a": 1}, 2, {"plan": "p3"}, root,
                                   splits={"b": {1: 0.25, 0: 0.75}})
    split = tables.read_assignment(spark, version=v3, root=root)
    assert split.splits == {"b": {0: 0.75, 1: 0.25}}
    assert split.routing == {"a": 1, "b": 0}    # a split key's largest share
    assert (split.metadata["table_size"], split.metadata["split_keys"]) == (3, 1)
    with pytest.raises(tables.AssignmentError, match="not one of its split instances"):
        tables.publish_assignment(spark, {"b": 1}, 3, root=root, splits={"b": {0: 0.5, 2: 0.5}})


@pytest.mark.slow
def test_rejection_reasons_name_every_failing_check(spark):
    from pyspark.sql import functions as F

    from rebalance.spark import tables
    from rebalance.streaming.job import quarantine_rows, valid_events

    t = "2024-01-01T00:00:01.000Z"
    rows = [
        ("ok", "k", "1.5", "0.5", t),
        ("ok-plain-time", "k", "0", "1", "2024-01-01 00:00:02"),
        (None, "k", "1", "1", t),
        ("e1", " ", "1", "1", t),
        ("e2", "k", None, "1", t),
        ("e3", "k", "abc", "1", t),
        ("e4", "k", "-2", "1", t),
        ("e5", "k", "NaN", "Infinity", t),
        ("e6", "k", "1", "", t),
        ("e7", "k", "1", "x", t),
        ("e8", "k", "1", "-1", None),
        ("e9", None, "-1", "1", "yesterday noon"),
    ]
    raw = spark.createDataFrame(rows, tables.EVENTS.schema)
    reasons = {r.event_id: r.reason for r in quarantine_rows(raw).collect()}
    assert reasons == {
        None: "missing_event_id", "e1": "missing_key", "e2": "missing_value",
        "e3": "non_numeric_value", "e4": "negative_value",
        "e5": "non_finite_value;invalid_cost", "e6": "missing_cost", "e7": "non_numeric_cost",
        "e8": "invalid_cost;missing_event_time",
        "e9": "missing_key;negative_value;unparseable_event_time"}
    valid = valid_events(raw).select("event_id", "value", "cost",
                                     F.unix_millis("event_time").alias("ms"))
    assert sorted(map(tuple, valid.collect())) == [
        ("ok", 1.5, 0.5, T0_MS + 1000), ("ok-plain-time", 0.0, 1.0, T0_MS + 2000)]
