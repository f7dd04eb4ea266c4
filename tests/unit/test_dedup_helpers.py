"""Duplicates dropped in the keyed operator (no JVM): the ids a key holds, when it forgets
them, the state layout (with and without ids), and how a restart's migration carries them."""

from __future__ import annotations

import argparse

import pandas as pd

from rebalance.cli.job_options import add_job_options, add_spark_options, job_config_from_args
from rebalance.core.placement import default_instances
from rebalance.spark.tables import INSTANCE_HISTOGRAMS
from rebalance.streaming.job import JobConfig
from rebalance.streaming.key_state import KeyWindows, dedup_horizon
from rebalance.streaming.processor import (
    HANDOFF,
    HANDOFF_COLUMNS_DDL,
    INITIAL_STATE_DDL,
    PERKEY,
    PERKEY_VALUE_DDL,
    PERWINDOW,
    PERWINDOW_VALUE_DDL,
    output_frame,
)
from rebalance.streaming.restart.state import migrate_state
from rebalance.streaming.routing import instance_labels

COLUMNS = [c.split()[0] for c in INITIAL_STATE_DDL.split(", ")]


def test_a_repeated_id_is_a_duplicate_within_the_batch_and_against_held_ids():
    state = KeyWindows(1, 0, 0)
    assert state.remember(["a", "b", "a"], [100, 200, 100]) == [False, False, True]
    assert state.seen_ids == ["a", "b"] and state.seen_times == [100, 200]
    # The next batch: "b" was held, "c" is new, "c" again is a duplicate of this batch.
    assert state.remember(["b", "c", "c"], [200, 300, 300]) == [True, False, True]
    assert state.seen_ids == ["a", "b", "c"]


def test_ids_are_forgotten_once_their_time_plus_the_delay_is_below_the_watermark():
    state = KeyWindows(1, 0, 0)
    state.remember(["a", "b", "c"], [1_000, 5_000, 9_000])
    # Watermark 10 s, delay 5 s: keep event times >= 5 s (dropDuplicatesWithinWatermark).
    assert dedup_horizon(10_000, 5_000) == 5_000
    assert state.forget(dedup_horizon(10_000, 5_000))
    assert state.seen_ids == ["b", "c"] and state.seen_times == [5_000, 9_000]
    assert not state.forget(5_000)               # nothing more to forget
    # A forgotten id counts again (its copy would be late: Spark drops it before).
    assert state.remember(["a"], [1_000]) == [False]


def test_a_key_with_ids_but_no_window_is_not_empty():
    state = KeyWindows(1, 0, 0)
    assert state.empty
    state.remember(["a"], [1])
    assert not state.empty
    state.forget(2)
    assert state.empty


def test_state_layout_round_trip_and_the_earlier_layout_reads_without_ids():
    state = KeyWindows(3, 1, 7, [0, 10_000], [2, 1], [3.0, 1.0], [2.0, 1.0], ["x", "y"],
                       [5, 10_005])
    value = state.to_state()
    assert len(value) == len(PERKEY_VALUE_DDL.split(", "))
    assert KeyWindows.from_state(value, 0, 0, 0) == state
    # A value of the layout before dedup (7 fields) holds no ids.
    old = KeyWindows.from_state(value[:7], 0, 0, 0)
    assert old.seen_ids == [] and old.seen_times == [] and old.windows == [0, 10_000]
    assert KeyWindows.from_state((3, 1, 7, [], [], [], [], None, None), 0, 0, 0).seen_ids == []
    assert PERWINDOW_VALUE_DDL.endswith("duplicates BIGINT")
    assert "seen_ids ARRAY<STRING>, seen_times ARRAY<BIGINT>" in HANDOFF_COLUMNS_DDL


def test_handoff_rows_carry_the_ids_and_instance_histograms_the_duplicates():
    frame = output_frame([
        {"kind": HANDOFF, "key": "k", "windows": [0], "counts": [1], "sums": [1.0],
         "costs": [1.0], "seen_ids": ["e1"], "seen_times": [3]},
        {"kind": "instance_histogram", "window_start_ms": 0, "instance": 0, "duplicates": 4}])
    assert list(frame.loc[0, "seen_ids"]) == ["e1"] and list(frame.loc[0, "seen_times"]) == [3]
    assert frame.loc[1, "duplicates"] == 4
    assert INSTANCE_HISTOGRAMS.columns[-1] == "duplicates"


def _state(keys, n, window=10_000):
    labels = instance_labels(n)
    rows = []
    for i, key in enumerate(keys):
        d = int(default_instances([key], n)[0])
        rows.append({"label": labels[d], "kind": PERKEY, "key": key, "key_group": i,
                     "default_instance": d, "version": 0, "windows": [window], "counts": [1],
                     "sums": [1.0], "costs": [1.0], "seen_ids": [f"{key}-e"],
                     "seen_times": [window + 1]})
    for instance in range(n):
        rows.append({"label": labels[instance], "kind": PERWINDOW, "window_start_ms": window,
                     "events": 0, "load": 0.0, "task_ns": 1, "cpu_ns": 1, "version": 0,
                     "duplicates": instance + 2})
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def test_a_moved_key_takes_its_ids_to_its_new_label_and_duplicates_stay_per_instance():
    keys = [f"k{i}" for i in range(12)]
    state = _state(keys, 2)
    routing = {"k1": 1 - int(default_instances(["k1"], 2)[0])}
    out = migrate_state(state, 2, 2, routing, version=4)
    perkey = out[out.kind == PERKEY].set_index("key")
    assert perkey.loc["k1", "label"] == instance_labels(2)[routing["k1"]]
    assert all(list(perkey.loc[k, "seen_ids"]) == [f"{k}-e"] for k in keys)
    windows = out[out.kind == PERWINDOW].set_index("label")
    assert {lab: int(windows.loc[lab, "duplicates"]) for lab in windows.index} == {
        instance_labels(2)[i]: i + 2 for i in range(2)}
    # Scale in to 1: the duplicates of both old instances go to instance 0.
    one = migrate_state(state, 2, 1, {}, version=5)
    assert one[one.kind == PERWINDOW]["duplicates"].sum() == 2 + 3


def test_a_window_with_duplicates_only_is_kept_and_state_of_the_earlier_layout_migrates():
    state = _state(["a"], 2)
    state.loc[state.kind == PERKEY, "windows"] = pd.Series([[0]] * 1, dtype=object).values
    out = migrate_state(state, 2, 2, {}, version=1)
    windows = out[out.kind == PERWINDOW]
    assert sorted(windows["duplicates"]) == [2, 3] and (windows["events"] == 0).all()
    old = state.drop(columns=["seen_ids", "seen_times", "duplicates"]).reindex(columns=COLUMNS)
    moved = migrate_state(old, 2, 3, {}, version=1)
    assert moved[moved.kind == PERWINDOW]["duplicates"].fillna(0).sum() == 0


def test_a_key_split_by_a_live_switch_merges_its_ids():
    state = _state(["a"], 2)
    twin = state[state.kind == PERKEY].copy()
    twin["label"] = [instance_labels(2)[1 - int(twin["default_instance"].iloc[0])]]
    twin["seen_ids"], twin["seen_times"] = [["a-e", "a-f"]], [[10_001, 10_002]]
    out = migrate_state(pd.concat([state, twin], ignore_index=True), 2, 2, {}, 1)
    (row,) = out[out.kind == PERKEY].itertuples()
    assert list(row.seen_ids) == ["a-e", "a-f"] and list(row.seen_times) == [10_001, 10_002]


def test_dedup_is_on_by_default_and_can_be_switched_off():
    config = JobConfig()
    assert config.dedup and config.processor_settings().dedup
    assert config.processor_settings().dedup_ms == 10_000
    parser = argparse.ArgumentParser()
    add_job_options(parser)
    add_spark_options(parser)
    assert job_config_from_args(parser.parse_args([])).dedup
    assert not job_config_from_args(parser.parse_args(["--no-dedup"])).dedup
    assert job_config_from_args(parser.parse_args(["--dedup"])).dedup
    assert not JobConfig(dedup=False).processor_settings().dedup
