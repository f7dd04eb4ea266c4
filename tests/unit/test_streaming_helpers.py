"""Pure helpers of the Spark side: labels, window state, generator, configurations (no JVM)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rebalance.core.placement import default_instances, spark_hash_int
from rebalance.spark.tables import (
    ASSIGNMENTS,
    TABLES,
    AssignmentError,
    TableError,
    flat_schema,
    get_table,
    validate_routing,
)
from rebalance.streaming.generator import (
    MALFORMED_KINDS,
    EventGenerator,
    GeneratorConfig,
    GeneratorError,
    fluctuate,
    zipf_weights,
)
from rebalance.streaming.job import JobConfig, JobError
from rebalance.streaming.key_state import (
    KeyWindows,
    closes_or_expires,
    dedup_horizon,
    retained,
    windows_to_emit,
)
from rebalance.streaming.processor import (
    OUTPUT_COLUMNS,
    OUTPUT_DDL,
    STATE_KEY_BYTES,
    STATE_WINDOW_BYTES,
    output_frame,
    state_bytes,
)
from rebalance.streaming.routing import instance_labels

W = 10_000  # window length in ms used below


# --------------------------------------------------------------------------- labels

@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 16, 32])
def test_label_of_instance_i_hashes_to_partition_i_and_is_the_smallest(n):
    labels = instance_labels(n)
    assert [spark_hash_int(label) % n for label in labels] == list(range(n))
    for i, label in enumerate(labels):
        assert all(spark_hash_int(smaller) % n != i for smaller in range(label))


def test_labels_need_at_least_one_instance():
    with pytest.raises(ValueError, match=">= 1"):
        instance_labels(0)


# --------------------------------------------------------------------------- window state

def test_key_windows_keeps_windows_sorted_and_merges_equal_starts():
    state = KeyWindows(key_group=7, default_instance=1, version=0)
    state.add(2 * W, 3, 30.0, 3.0)
    state.add(0, 1, 10.0, 1.5)
    state.add(2 * W, 2, 5.0, 0.5)
    assert state.windows == [0, 2 * W]
    assert state.window(2 * W) == (5, 35.0, 3.5)
    assert state.window(0) == (1, 10.0, 1.5)


def test_sliding_aggregate_covers_the_last_n_windows_ending_at_the_window():
    state = KeyWindows(0, 0, 0)
    for i, count in enumerate([1, 2, 4, 8]):
        state.add(i * W, count, float(count), 0.0)
    assert state.sliding(3 * W, W, 2) == (12, 12.0)
    assert state.sliding(3 * W, W, 3) == (14, 14.0)
    assert state.sliding(W, W, 5) == (3, 3.0)
    assert state.sliding(5 * W, W, 2) == (0, 0)  # nothing held in windows 4 and 5


def test_prune_keeps_what_open_windows_still_need():
    state = KeyWindows(0, 0, 0)
    for i in range(5):
        state.add(i * W, 1, 1.0, 1.0)
    # watermark in window 3: windows 3, 4 are open; with n = 2 they need windows 2..4
    assert state.prune(3 * W + 1, W, 2)
    assert state.windows == [2 * W, 3 * W, 4 * W]
    assert not state.prune(3 * W + 1, W, 2)
    assert retained(2 * W, 3 * W + 1, W, 2) and not retained(W, 3 * W + 1, W, 2)


def test_state_round_trip():
    state = KeyWindows(5, 2, 9, [0, W], [1, 2], [1.5, 2.5], [0.5, 1.0])
    assert KeyWindows.from_state(state.to_state(), 0, 0, 0) == state
    empty = KeyWindows.from_state(None, 3, 1, 4)
    assert (empty.key_group, empty.default_instance, empty.version, empty.windows) == (3, 1, 4, [])


def test_a_key_is_skipped_at_a_window_close_only_when_decoding_it_would_change_nothing():
    """closes_or_expires reads the raw state value; it must agree with what decoding the
    key and closing the windows would do (a histogram row, a prune, a forget), on random
    states, closing sets and watermarks, and on the older layout without event ids."""
    rng = np.random.default_rng(3)
    n_windows, delay = 2, W // 2
    for _ in range(2000):
        windows = sorted(set(int(w) * W for w in rng.integers(0, 8, rng.integers(0, 4))))
        times = [int(t) for t in rng.integers(0, 8 * W, rng.integers(0, 3))]
        state = KeyWindows(1, 2, 3, windows, [1] * len(windows), [1.0] * len(windows),
                           [1.0] * len(windows), [f"e{i}" for i in range(len(times))], times)
        watermark = int(rng.integers(0, 9 * W))
        closing = {w: None for w in range(0, 9 * W, W) if w + W <= watermark
                   and rng.random() < 0.7}
        horizon = dedup_horizon(watermark, delay)
        decoded = KeyWindows.from_state(state.to_state(), 0, 0, 0)
        changes = bool(closing.keys() & set(decoded.windows))
        changes |= decoded.prune(watermark, W, n_windows)
        changes |= decoded.forget(horizon)
        assert closes_or_expires(state.to_state(), closing, watermark - n_windows * W,
                                 horizon) == changes, (state, watermark, sorted(closing))
    old_layout = (1, 2, 3, [0, W], [1, 1], [1.0, 1.0], [1.0, 1.0])
    assert not closes_or_expires(old_layout, {}, -1, 0)
    assert closes_or_expires(old_layout, {W: None}, -1, 0)
    assert not closes_or_expires((1, 2, 3, [W], [1], [1.0], [1.0], None, float("nan")),
                                 {}, 0, 10 * W)


def test_windows_to_emit_includes_later_windows_whose_sliding_aggregate_changed():
    held = [0, W, 2 * W, 3 * W, 4 * W]
    assert windows_to_emit([W], held, W, 1) == [W]
    assert windows_to_emit([W], held, W, 3) == [W, 2 * W, 3 * W]
    assert windows_to_emit([4 * W, 0], held, W, 2) == [0, W, 4 * W]


def test_state_bytes_estimate():
    assert state_bytes("k1", 0) == 2 + STATE_KEY_BYTES
    key = "ключ"
    assert state_bytes(key, 3) == len(key.encode()) + STATE_KEY_BYTES + 3 * STATE_WINDOW_BYTES


def test_output_frame_has_every_column_with_nulls_for_absent_values():
    frame = output_frame([{"kind": "result", "key": "k", "window_start_ms": 0, "events": 3}])
    assert list(frame.columns) == list(OUTPUT_COLUMNS)
    assert frame.loc[0, "events"] == 3 and pd.isna(frame.loc[0, "load"])
    assert OUTPUT_DDL.split(", ")[:3] == ["kind STRING", "key STRING", "window_start_ms BIGINT"]


# --------------------------------------------------------------------------- generator

def small(**kw) -> GeneratorConfig:
    return GeneratorConfig(**{"n_keys": 50, "events_per_batch": 400, **kw})


def test_batches_are_a_pure_function_of_config_and_batch_number():
    config = small(fluctuation=1.0, cost_sigma=0.5, malformed_fraction=0.1)
    first = EventGenerator(config).batch(3)
    again = EventGenerator(config)
    again.batch(5)
    second = again.batch(3)
    pd.testing.assert_frame_equal(first.events, second.events)
    pd.testing.assert_series_equal(first.malformed, second.malformed)
    other = EventGenerator(small(seed=1, fluctuation=1.0, cost_sigma=0.5)).batch(3)
    assert not first.events["key"].equals(other.events["key"])


def test_events_have_unique_ids_and_times_inside_their_batch():
    gen = EventGenerator(small(batch_seconds=5.0))
    frames = [gen.batch(b).events for b in range(3)]
    ids = pd.concat(f["event_id"] for f in frames)
    assert ids.is_unique
    for b, frame in enumerate(frames):
        t = pd.to_datetime(frame["event_time"], utc=True)
        start = pd.Timestamp("2024-01-01T00:00:00Z") + pd.Timedelta(seconds=5 * b)
        assert (t >= start).all() and (t < start + pd.Timedelta(seconds=5)).all()


def test_keys_follow_zipf_and_costs_have_mean_one():
    gen = EventGenerator(GeneratorConfig(n_keys=100, zipf=1.0, events_per_batch=50_000,
                                         cost_sigma=0.8))
    events = gen.batch(0).events
    counts = events["key"].value_counts()
    top = gen.keys[np.argmax(gen.frequencies(0))]
    assert counts.index[0] == top
    assert counts.iloc[0] / len(events) == pytest.approx(zipf_weights(100, 1.0)[0], rel=0.05)
    assert events["cost"].astype(float).mean() == pytest.approx(1.0, rel=0.03)


def test_malformed_events_are_spoiled_as_their_kind_says():
    batch = EventGenerator(small(malformed_fraction=0.5)).batch(0)
    kinds = batch.malformed.dropna()
    assert set(kinds) == set(MALFORMED_KINDS)
    ev = batch.events
    assert ev.loc[batch.malformed == "missing_key", "key"].isna().all()
    assert (ev.loc[batch.malformed == "negative_value", "value"].astype(float) < 0).all()
    assert (ev.loc[batch.malformed == "non_numeric_value", "value"] == "n/a").all()
    bad_time = pd.to_datetime(ev.loc[batch.malformed == "unparseable_event_time", "event_time"],
                              errors="coerce")
    assert bad_time.isna().all()
    clean = ev[batch.malformed.isna()]
    assert clean["key"].notna().all() and (clean["value"].astype(float) >= 0).all()


def test_fluctuation_reaches_the_target_change_and_keeps_the_frequencies():
    keys = np.array([f"k{i}" for i in range(200)], dtype=object)
    instances = default_instances(keys, 4)
    freq = zipf_weights(200, 1.0)
    new, change = fluctuate(freq, instances, 4, 1.0, np.random.default_rng(0), max_swaps=2000)
    before = np.bincount(instances, weights=freq, minlength=4)
    after = np.bincount(instances, weights=new, minlength=4)
    assert change >= 1.0
    assert np.abs(after - before).max() / (1 / 4) == pytest.approx(change)
    assert np.allclose(np.sort(new), np.sort(freq))


def test_fluctuation_gives_up_after_max_swaps_when_the_target_is_unreachable():
    instances = np.array([0, 1, 0, 1])
    freq = np.full(4, 0.25)  # uniform: no swap changes anything
    new, change = fluctuate(freq, instances, 2, 0.5, np.random.default_rng(0), max_swaps=100)
    assert change == 0.0 and np.array_equal(new, freq)


def test_generator_config_is_validated_and_fingerprinted():
    with pytest.raises(GeneratorError, match="malformed_fraction"):
        GeneratorConfig(malformed_fraction=1.5)
    with pytest.raises(GeneratorError, match="ISO-8601"):
        GeneratorConfig(start="not a time")
    assert small().fingerprint() == small().fingerprint() != small(seed=2).fingerprint()


# --------------------------------------------------------------------------- tables, job config

def test_routing_is_validated_against_the_instance_count():
    assert validate_routing({"b": 1, "a": np.int64(0)}, 2) == {"a": 0, "b": 1}
    with pytest.raises(AssignmentError, match=r"outside \[0, 2\)"):
        validate_routing({"a": 2}, 2)
    with pytest.raises(AssignmentError, match="non-empty strings"):
        validate_routing({"": 0}, 2)
    with pytest.raises(AssignmentError, match="integer"):
        validate_routing({"a": 0.5}, 2)
    with pytest.raises(AssignmentError, match="n_instances"):
        validate_routing({}, 0)


def test_tables_have_paths_schemas_and_clear_errors(tmp_path):
    assert ASSIGNMENTS.path(tmp_path) == str(tmp_path / "assignments")
    assert set(TABLES) >= {"events", "quarantine", "results", "key_histograms",
                           "instance_histograms", "assignments"}
    hist = get_table("key_histograms").columns
    assert hist[:5] == ["window_start", "key", "count", "cost", "state_bytes"]
    assert flat_schema("a BIGINT, b timestamp").fieldNames() == ["a", "b"]
    with pytest.raises(TableError, match="unknown table 'nope'"):
        get_table("nope")
    with pytest.raises(TableError, match="cannot parse column"):
        flat_schema("a MAP<STRING, INT>")


def test_job_config_validation_and_paths(tmp_path):
    config = JobConfig(window_seconds=2.5, checkpoint_root=str(tmp_path), name="j1")
    assert config.window_ms == 2500
    assert config.checkpoint("keyed") == str(tmp_path / "j1" / "keyed")
    assert config.processor_settings().window_ms == 2500
    for bad, match in (({"n_instances": 0}, "n_instances"), ({"window_seconds": 0}, "window"),
                       ({"name": "a b"}, "name"), ({"trigger_seconds": 0}, "trigger")):
        with pytest.raises(JobError, match=match):
            JobConfig(**bad)


def test_the_keyed_job_refuses_to_run_without_histograms_before_it_touches_spark():
    from rebalance.streaming.builtin import processor, start_job
    from rebalance.streaming.sliding import SlidingWindows

    with pytest.raises(JobError, match="always writes its histograms .* restartable_job.py"):
        start_job(None, JobConfig(emit_histograms=False))
    # the built-in processor: duplicates dropped within the watermark, or not at all
    made = processor(JobConfig(window_seconds=10, n_windows=3, watermark_seconds=5))
    assert type(made) is SlidingWindows
    assert (made.window_ms, made.n_windows, made.dedup_ms) == (10_000, 3, 5_000)
    assert processor(JobConfig(dedup=False)).dedup_ms is None
    worked = processor(JobConfig(work=lambda cost: None))
    assert type(worked).__name__ == "WorkedSlidingWindows"
