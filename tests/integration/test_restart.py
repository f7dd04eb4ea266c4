"""Controlled restart with state migration on real Spark + Delta + RocksDB state.

One scenario runs once for the module, while a feeder thread keeps appending
generator batches to ``events``:

1. generation 0 (N = 3) runs; plan 1 moves 20 % of the keys (same N: the new generation
   keeps the checkpoint; the old one's last batch gives the moved keys' state away, the
   new one's first batch takes it over, inside the stream);
2. plan 2 scales out to N = 4 and moves keys (a new checkpoint seeded with the state);
3. plan 3 scales in to N = 2;

   each restart "crashes" at one step (plan 1 right after the old generation stopped
   past its export, plan 2 while it writes the migrated state, plan 3 after the new
   generation started, before the acknowledgement): the driver's queries are killed
   mid-flight and a new driver recovers the restart from the ``restarts`` table;
4. a fourth request (same N) fails while it prepares and is rolled back: N = 2 stays in
   force, and its version (the latest, published for the restart) is not followed live;
5. a live switch (a version published for broadcast, same N) is used by the running
   generation from its next micro-batch, without a restart; it also splits a key over
   both instances;
6. a last restart (same N) migrates from the routing in force, the live switch's,
   merging the state the switch split and the split key's partials (un-split);
7. the feeder stops; the job drains and stops; every key's state is held once, by its
   instance under the last plan.

Every generation follows the latest assignment version (the default), so plans for a
restart are published as the DAG publishes them (``apply_mode`` restart): the running
generation holds at the boundary instead of following them live.

Expectations are recomputed with pandas from the generator (a batch oracle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from dag_helpers import LIVE, StandIn, dag, data  # noqa: F401 - dag, data are fixtures
from restart_helpers import (
    Feeder,
    crash_and_recover,
    drain,
    faulty_job,
    instances,
    publish_moving_plan,
    wait_commits,
)

from rebalance.streaming.routing import instance_labels

pytestmark = pytest.mark.slow

W_MS = 10_000
N_WINDOWS = 2
T0_MS = 1_704_067_200_000
GEN = dict(n_keys=40, zipf=0.8, events_per_batch=120, batch_seconds=10.0, n_instances=3,
           seed=11)


@dataclass
class Scenario:
    expected: pd.DataFrame
    results: pd.DataFrame
    plans: list[dict]             # version, n, routing, moved fraction, request id
    statuses: list[dict]
    failed: dict
    steps: pd.DataFrame
    unmoved_equal: bool
    unmoved_checked: int
    generations: list
    failed_version: int
    live: dict                    # the live switch: version, routing, moved keys, published_after
    final: dict                   # the last restart (after the live switch), with its status
    final_state: list             # (label, key) of every key's state after the drain
    window_results: pd.DataFrame


def _expected(gen, batches) -> pd.DataFrame:
    frames = []
    for b in batches:
        ev = gen.batch(b).events
        ms = (pd.to_datetime(ev["event_time"], utc=True)
              - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
        frames.append(pd.DataFrame({"key": ev["key"].to_numpy(),
                                    "value": ev["value"].astype(float).to_numpy(),
                                    "window": (ms - ms % W_MS - T0_MS).to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def _plan(spark, root, keys, n, previous, fraction=0.2, apply_mode="restart"):
    return publish_moving_plan(spark, root, keys, n, previous, fraction, "restart", apply_mode)


def _last_committed(job) -> int:
    """Global id of the running generation's last committed batch (-1: none)."""
    from rebalance.streaming.restart import checkpoint_position

    last = checkpoint_position(job.generation.checkpoint).last_batch
    return job.generation.batch_offset + (last if last is not None else -1)


def _perkey(spark, checkpoint, batch=None):
    reader = (spark.read.format("statestore").option("path", checkpoint)
              .option("stateVarName", "perkey"))
    if batch is not None:
        reader = reader.option("batchId", batch)
    rows = reader.load().selectExpr("key.label AS label", "user_map_key.key AS key",
                                    "to_json(user_map_value) AS value").collect()
    return {r.key: (r.label, r.value) for r in rows}


def _handed_over(spark, checkpoint):
    """State handed over inside the stream of a checkpoint: key -> (label, state as JSON,
    the exporting label's watermark) of its ``in`` rows (written by the old generation's
    sink in its export batch)."""
    from rebalance.streaming.restart.state import handoff_table

    rows = spark.read.format("delta").load(handoff_table(checkpoint))
    return {r.key: (r.label, r.value, r.export_watermark_ms)
            for r in rows.where("handoff = 'in'").selectExpr(
        "label", "key", "to_json(named_struct('key_group', key_group, 'default_instance', "
        "default_instance, 'version', state_version, 'windows', windows, 'counts', counts, "
        "'sums', sums, 'costs', costs, 'seen_ids', seen_ids, 'seen_times', seen_times)) "
        "AS value", "export_watermark_ms").collect()}


def _exportable(value: str, watermark: int, config) -> list[dict]:
    """The states a key untouched by the export batch may be handed over with: as it was,
    or as the windows the export batch's watermark closed left it (closed windows are
    emitted, then pruned and old event ids forgotten, before the key is given away)."""
    from rebalance.streaming.key_state import KeyWindows, dedup_horizon

    before = json.loads(value)
    state = KeyWindows(**before)
    s = config.processor_settings()
    state.prune(watermark, s.window_ms, s.n_windows)
    state.forget(dedup_horizon(watermark, s.dedup_ms))
    pruned = dict(zip(before, state.to_state()))
    return [before, pruned]


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory) -> Scenario:
    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig
    from rebalance.streaming.restart import request_restart

    key = "spark.databricks.delta.snapshotPartitions"
    previous_conf = spark.conf.get(key, None)
    spark.conf.set(key, "1")
    root = str(tmp_path_factory.mktemp("tables"))
    config = JobConfig(n_instances=3, window_seconds=W_MS / 1000, n_windows=N_WINDOWS,
                       watermark_seconds=5, max_files_per_trigger=2, trigger_seconds=0.5,
                       name="rtest", tables_root=root,
                       checkpoint_root=str(tmp_path_factory.mktemp("checkpoints")))
    gen = EventGenerator(GeneratorConfig(**GEN))
    keys = list(gen.keys)
    append_batches(spark, gen, range(2), root)
    job = faulty_job(spark, config)
    job.start()
    # A batch every 1.5 s, no limit: a wait for commits needs new events, and on a loaded
    # machine the scenario takes longer than any fixed number of batches would last.
    feeder = Feeder(lambda b: append_batches(spark, gen, [b], root), first=2, period=1.5,
                    limit=10_000)
    feeder.start()
    plans, statuses, generations = [], [], [job.generation]
    try:
        wait_commits(job, n=2)
        # Plan 1: same N, 20 % of the keys move.
        p1 = _plan(spark, root, keys, 3, ({}, 3))
        p1["request"] = request_restart(spark, p1["version"], 3, job=config.name, root=root)
        before = job.generation
        job = crash_and_recover(job, "stop", spark, config)   # crash right after the stop
        generations.append(job.generation)
        plans.append(p1)
        # Same N: the checkpoint stays. The old generation's last batch (e) gave away the
        # state of exactly the keys its labels held for another instance under plan 1,
        # values unchanged, to their new labels; unmoved keys were not touched.
        new = job.generation
        assert new.in_place and new.checkpoint == before.checkpoint and new.start_batch > 1
        e = new.start_batch - 1
        before_export = _perkey(spark, before.checkpoint, e - 1)
        after_export = _perkey(spark, before.checkpoint, e)
        touched = {r.key for r in tables.read(spark, tables.RESULTS, root)
                   .where(f"batch_id = {new.batch_offset + e}").select("key").collect()}
        ins = _handed_over(spark, new.checkpoint)
        labels = instance_labels(3)
        target = lambda keys: dict(zip(keys, (labels[i] for i in instances(  # noqa: E731
            list(keys), p1["routing"], 3))))
        want = target(set(before_export) | set(ins) | set(after_export))
        moved = {k for k, (label, _) in before_export.items() if want[k] != label}
        assert moved and moved <= set(ins) <= moved | touched
        assert all(ins[k][0] == want[k] for k in moved)
        assert all(json.loads(ins[k][1]) in _exportable(before_export[k][1], ins[k][2], config)
                   for k in moved - touched)
        assert all(label == want[k] for k, (label, _) in after_export.items())
        # (Their values may change in batch e as in any batch: events, closed windows.)
        unmoved = [k for k in before_export if k not in moved]
        unmoved_equal = (not set(unmoved) & set(ins)) and all(
            after_export[k][0] == before_export[k][0] for k in unmoved if k in after_export)
        wait_commits(job, n=2)

        # Plan 2: scale out to N = 4, crash while writing the migrated state.
        p2 = _plan(spark, root, keys, 4, (p1["routing"], 3))
        p2["request"] = request_restart(spark, p2["version"], 4, job=config.name, root=root)
        job = crash_and_recover(job, "state", spark, config)  # crash writing the state
        generations.append(job.generation)
        plans.append(p2)
        wait_commits(job, n=2)

        # Plan 3: scale in to N = 2.
        p3 = _plan(spark, root, keys, 2, (p2["routing"], 4))
        p3["request"] = request_restart(spark, p3["version"], 2, job=config.name, root=root)
        job = crash_and_recover(job, "start", spark, config)  # crash after the new start
        generations.append(job.generation)
        plans.append(p3)
        wait_commits(job, n=2)

        # A restart that fails while starting is rolled back: plan 3 stays in force.
        p4 = _plan(spark, root, keys, 2, (p3["routing"], 2))
        failed_id = request_restart(spark, p4["version"], 2, job=config.name, root=root)
        job.fail.add("prepare")
        job.poll()
        failed = job.control.status(failed_id)
        generations.append(job.generation)
        wait_commits(job, n=2)

        # A live switch while generation 3 runs: used from its next micro-batch, no restart.
        # It also splits the hottest key it does not move.
        hottest = max(keys[6:], key=dict(zip(keys, gen.frequencies(0))).get)
        live = publish_moving_plan(spark, root, keys, 2, (p3["routing"], 2), 0.15, "restart",
                                   "broadcast", splits={hottest: {0: 0.5, 1: 0.5}})
        live["published_after"] = _last_committed(job)
        wait_commits(job, n=3)
        assert job.generation == generations[-1]

        # A last restart, same N: from the routing in force (the live switch's).
        final = _plan(spark, root, keys, 2, (live["routing"], 2), fraction=0.25)
        final["request"] = request_restart(spark, final["version"], 2, job=config.name,
                                           root=root)
        job.poll()
        final["status"] = job.control.status(final["request"])
        final["started"] = next(s for s in job.control.steps(final["request"])
                                if s.step == "started").detail
        generations.append(job.generation)
        final["first_batch"] = job.generation.batch_offset + job.generation.start_batch
        wait_commits(job, n=2)
    finally:
        feeder.halt.set()
        feeder.join()
    assert feeder.error is None, feeder.error
    drain(job)
    job.stop()
    final_state = (spark.read.format("statestore").option("path", job.generation.checkpoint)
                   .option("stateVarName", "perkey").load()
                   .selectExpr("key.label AS label", "user_map_key.key AS key").collect())
    statuses = [job.control.status(p["request"]) for p in plans]
    steps = tables.read(spark, tables.RESTARTS, root).toPandas()
    results = _windowed(tables.read(spark, tables.RESULTS, root).toPandas())
    window_results = _windowed(tables.read(spark, tables.WINDOW_RESULTS, root).toPandas())
    if previous_conf is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, previous_conf)
    return Scenario(_expected(gen, range(feeder.next)), results, plans, statuses, failed, steps,
                    unmoved_equal, len(unmoved), generations, p4["version"], live, final,
                    [(r.label, r.key) for r in final_state], window_results)


def _windowed(frame: pd.DataFrame) -> pd.DataFrame:
    frame["window"] = (frame["window_start"].astype("int64") // 1000
                       if str(frame["window_start"].dtype).endswith("[us]")
                       else frame["window_start"].astype("int64") // 1_000_000) - T0_MS
    return frame


def test_three_plans_each_move_at_least_ten_percent_and_are_acknowledged(scenario):
    assert len(scenario.plans) >= 3
    before_n = [3] + [p["n"] for p in scenario.plans[:-1]]
    for plan, status, n in zip(scenario.plans, scenario.statuses, before_n):
        assert plan["moved"] >= 0.10, plan
        assert status["state"] == "acknowledged", status
        same_n = plan["n"] == n       # same N: the checkpoint stays, no stop before started
        assert status["steps"] == (["requested", "started", "acknowledged"] if same_n else
                                   ["requested", "stopped", "state_written", "started",
                                    "acknowledged"]), status
    numbers = [g.number for g in scenario.generations]
    assert numbers == [0, 1, 2, 3, 3, 4]
    assert [g.n_instances for g in scenario.generations] == [3, 3, 4, 2, 2, 2]
    assert [g.in_place for g in scenario.generations] == [False, True, False, False, False,
                                                          True]


def test_results_equal_a_batch_recomputation(scenario):
    res, exp = scenario.results, scenario.expected
    assert not res.duplicated(["batch_id", "key", "window", "instance"]).any()
    # one row per batch, key and window, but for the key split over two instances
    doubled = res[res.duplicated(["batch_id", "key", "window"], keep=False)]
    assert set(doubled["key"]) <= set(scenario.live["splits"])
    got = res.groupby(["key", "window"])["events"].sum().sort_index()
    want = exp.groupby(["key", "window"]).size().sort_index()
    pd.testing.assert_series_equal(got, want, check_names=False)
    # The last row of every (key, window) holds its full running and sliding aggregates:
    # state followed every moved key through every restart. (Not through the live switch,
    # by design: a key it moved starts from empty state on its new instance, so windows
    # it updated after the switch are left out here.)
    live = scenario.live
    switched = res[(res.assignment_version == live["version"])
                   & res.key.isin([*live["moved_keys"], *live["splits"]])][
        ["key", "window"]].drop_duplicates()
    skip = pd.MultiIndex.from_frame(switched)
    last = res.sort_values("batch_id").groupby(["key", "window"]).last()
    last = last[~last.index.isin(skip)]
    assert len(last) > 0.8 * len(res.groupby(["key", "window"]))
    per = exp.groupby(["key", "window"]).agg(n=("value", "size"), s=("value", "sum"))
    prev = per.rename(lambda w: w + W_MS, level="window").reindex(per.index, fill_value=0)
    per, prev = per.reindex(last.index), prev.reindex(last.index)
    assert (last["count"] == per["n"]).all()
    assert np.allclose(last["sum"], per["s"])
    wrong = last[last["sliding_count"] != per["n"] + prev["n"]]
    assert wrong.empty, (wrong[["batch_id", "assignment_version", "instance", "events", "count",
                                "sliding_count"]].assign(want=(per["n"] + prev["n"])),
                         res[res.key.isin(wrong.index.get_level_values(0)[:3])].sort_values(
                             "batch_id")[["batch_id", "assignment_version", "key", "window",
                                          "instance", "events", "count", "sliding_count"]]
                         .to_string())
    assert np.allclose(last["sliding_sum"], per["s"] + prev["s"])


def test_window_results_are_exact_across_restarts_crashes_a_live_switch_and_a_split(scenario):
    final, exp = scenario.window_results, scenario.expected
    assert not final.duplicated(["key", "window"]).any()
    last = final["window"].max()
    assert last >= 10 * W_MS
    per = exp[exp.window <= last].groupby(["key", "window"]).agg(
        n=("value", "size"), s=("value", "sum"))
    got = final.set_index(["key", "window"]).sort_index()
    assert got.index.equals(per.index)
    assert (got["count"] == per["n"]).all() and np.allclose(got["sum"], per["s"])
    prev = per.rename(lambda w: w + W_MS, level="window").reindex(per.index, fill_value=0)
    assert (got["sliding_count"] == per["n"] + prev["n"]).all()
    assert np.allclose(got["sliding_sum"], per["s"] + prev["s"])
    # the split key's windows while the live switch was in force came from both shares
    (key, _), = scenario.live["splits"].items()
    assert (got.loc[key, "instances"] == 2).any()


def test_every_row_is_routed_by_its_generation_and_runs_in_its_partition(scenario):
    res = scenario.results
    assert (res["partition_id"] == res["instance"]).all()
    live, final = scenario.live, scenario.final
    assignments = {0: ({}, 3), **{p["version"]: (p["routing"], p["n"]) for p in scenario.plans},
                   live["version"]: (live["routing"], live["n"]),
                   final["version"]: (final["routing"], final["n"])}
    assert set(res["assignment_version"]) == set(assignments)
    for version, (routing, n) in assignments.items():
        rows = res[res.assignment_version == version]
        if version == live["version"]:     # its split key's events go to either share
            split = rows[rows.key.isin(live["splits"])]
            assert set(split["instance"]) == {0, 1}
            rows = rows[~rows.key.isin(live["splits"])]
        assert (rows["instance"].to_numpy() == instances(rows["key"], routing, n)).all()
    # Batches keep one order across generations: every version occupies one batch range.
    spans = res.groupby("assignment_version")["batch_id"].agg(["min", "max"]).sort_index()
    assert (spans["min"].to_numpy()[1:] > spans["max"].to_numpy()[:-1]).all()


def test_unmoved_keys_keep_their_state_untouched(scenario):
    assert scenario.unmoved_checked >= 20
    assert scenario.unmoved_equal


def test_a_crash_at_every_step_is_recovered_and_steps_are_written_once(scenario):
    steps = scenario.steps
    assert not steps.duplicated(["request_id", "step"]).any()
    for crashed in scenario.statuses:  # crashes after stop, in the state rewrite, after start
        assert crashed["ok"] and crashed["pause_seconds"] is None  # completed by a new driver


def test_a_failed_restart_is_rolled_back_and_the_previous_assignment_stays(scenario):
    # Same N: it failed before the old generation gave anything away.
    assert scenario.failed["steps"] == ["requested", "failed", "rolled_back"]
    assert "injected failure" in scenario.failed["error"]
    assert scenario.generations[4] == scenario.generations[3]    # the one in force goes on
    # The rolled-back version stays out even though it was the latest: the generation kept
    # the version in force (plan 3) until the next followable version (the live switch).
    versions = scenario.results.sort_values("batch_id")["assignment_version"]
    assert scenario.failed_version not in set(versions)
    assert list(versions.unique()[-3:]) == [scenario.plans[-1]["version"],
                                            scenario.live["version"], scenario.final["version"]]


def test_a_live_switch_is_used_from_the_next_micro_batch(scenario):
    live, res = scenario.live, scenario.results
    assert live["moved"] >= 0.05 and live["moved_keys"], live   # N = 2: few keys can move
    # Batches that started after the publish are routed by it (the one in flight at the
    # publish may not be); rows record the version they were routed by.
    later = res[(res.batch_id > live["published_after"] + 1)
                & (res.batch_id < scenario.final["first_batch"])]
    assert len(later) and (later["assignment_version"] == live["version"]).all()
    assert (res.loc[res.assignment_version == live["version"], "batch_id"]
            > live["published_after"]).all()
    rows = res[res.assignment_version == live["version"]]
    assert rows.key.isin(live["moved_keys"]).any()
    split = rows.key.isin(live["splits"])     # its events go to either share
    assert set(rows.loc[split, "instance"]) == {0, 1}
    rows = rows[~split]
    assert (rows["instance"].to_numpy() == instances(rows["key"], live["routing"], 2)).all()


# --------------------------------------------------------------------- the DAG side
class RestartStandIn(StandIn):
    """Stands in for :class:`RestartableJob` in the DAG tests: answers each restart request
    of the ``restarts`` table with the given steps (a real job answers the same way)."""

    def __init__(self, spark, steps):
        super().__init__(spark)
        self.answer = steps
        self.answered = []

    def prepare(self):
        from rebalance.control.inputs import job_name
        from rebalance.streaming.restart import RestartControl

        self.control = RestartControl(self.spark, job_name())

    def step(self):
        pending = self.control.pending()
        if pending is None:
            return
        for step in self.answer:
            detail = {"error": "RestartError: injected"} if step == "failed" else {}
            self.control.record(pending, step, **detail)
        self.answered.append(pending)


def test_dag_restart_mode_requests_a_restart_and_waits_for_its_acknowledgement(dag, data,
                                                                             spark):
    from dag_helpers import JobStandIn, run_dag, seed_interval, traffic

    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore
    from rebalance.streaming.restart import RestartControl

    di = seed_interval(spark, dag, LIVE, traffic(skewed=True))
    answer = ["stopped", "state_written", "started", "acknowledged"]
    with JobStandIn(spark, di.end, traffic(skewed=True)), RestartStandIn(spark, answer) as job:
        dr, states = run_dag(dag, LIVE, {"method": "milp", "apply_mode": "restart"})
    assert dr.state == "success", states
    assert states["apply"] == states["await_restart"] == states["verify"] == "success"
    (plan,) = PlanStore(spark).plans()
    assert plan.status == "verified" and plan.apply_mode == "restart"
    assert job.answered == [plan.plan_id]  # the request id is the plan id
    status = RestartControl(spark, "keyed").status(plan.plan_id)
    assert status["ok"] and status["steps"] == ["requested", *answer]
    assert tables.latest_assignment_version(spark) == plan.assignment_version == 1


def test_dag_restart_mode_rolls_back_when_the_restart_fails(dag, data, spark):
    from dag_helpers import run_dag, seed_interval, traffic

    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore

    seed_interval(spark, dag, LIVE, traffic(skewed=True))
    with RestartStandIn(spark, ["failed", "rolled_back"]):
        dr, states = run_dag(dag, LIVE, {"method": "milp", "apply_mode": "restart"})
    assert dr.state == "failed" and states["apply"] == "success", states
    assert states["await_restart"] == "failed" and states["verify"] == "upstream_failed"
    (plan,) = PlanStore(spark).plans()
    assert plan.status == "diverged" and "restart failed" in plan.reasons[-1]
    history = tables.assignment_history(spark)
    assert [c.metadata["action"] for c in history] == ["rollback", "apply"]
    assert history[0].metadata["rollback_of"] == plan.plan_id
    assert tables.read_assignment(spark).routing == tables.read_assignment(spark, 0).routing


def test_a_restart_after_a_live_switch_migrates_from_the_routing_in_force(scenario):
    final = scenario.final
    assert final["status"]["ok"], final["status"]
    assert final["status"]["steps"] == ["requested", "started", "acknowledged"]
    assert final["started"]["from_version"] == scenario.live["version"]
    assert final["status"]["pause_seconds"] is not None
    # Every key's state is held once, by the label of its instance under the last plan:
    # the state the live switch split was merged, nothing was left behind.
    held = pd.DataFrame(scenario.final_state, columns=["label", "key"])
    assert len(held) >= 20 and not held.key.duplicated().any()
    want = np.array(instance_labels(2))[instances(held.key, final["routing"], 2)]
    assert (held.label.to_numpy() == want).all()
