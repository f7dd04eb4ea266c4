"""InstanceHost over an in-memory handle: each key's call gets exactly that key's rows, in
the order they came, as a frame of its own (index from 0), and the processor's output
frames carry their schema's types."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo
from pyspark.sql.types import StringType
from test_key_scope import FakeHandle

from rebalance.streaming.duplicates import DuplicatesError, count_duplicates
from rebalance.streaming.host import INSTANCE_ROW, KEY_ROW, HostSettings, InstanceHost
from rebalance.streaming.sliding import SLIDING_COLUMNS, _frame

USER = ("key", "seq")


class Recorder:
    """A processor without state: records each call's key and rows, emits nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def init(self, handle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):
        frames = list(rows)
        self.calls.append((key, frames))
        return iter(())

    def close(self) -> None:
        pass


class Times:
    def getCurrentWatermarkInMs(self):
        return 0

    def getCurrentProcessingTimeInMs(self):
        return 1_000


def host_frame(keys: list) -> pd.DataFrame:
    n = len(keys)
    return pd.DataFrame({
        "key": keys, "seq": np.arange(n), "rb_label": 0,
        "rb_key": [None if k is None else str(k) for k in keys], "rb_window": 0,
        "rb_cost": 1.0, "rb_version": 1, "rb_default": 0, "rb_group": 0, "rb_control": None,
        "rb_payload": None, "rb_routing_keys": None, "rb_routing_instances": None},
        index=np.arange(100, 100 + n))          # not a range from 0: the host's input isn't


def run(keys: list) -> list[tuple]:
    recorder = Recorder()
    host = InstanceHost(recorder, HostSettings(
        key_column="key", key_type=StringType(), user_columns=USER, output_columns=("key",),
        time_mode="EventTime", n_instances=1, labels=(0,), window_ms=10_000))
    host.init(FakeHandle())
    list(host.handleInputRows((0,), iter([host_frame(keys)]), Times()))
    return recorder.calls


def test_each_key_gets_its_own_rows_in_arrival_order_once():
    keys = ["b", "a", "b", "c", "a", "b", None, "c"]
    calls = run(keys)
    assert [key for key, _ in calls] == [("b",), ("a",), ("c",)]      # first appearance
    for key, frames in calls:
        assert len(frames) == 1
        frame = frames[0]
        assert list(frame.columns) == list(USER)
        assert list(frame.index) == list(range(len(frame)))
        assert list(frame["seq"]) == [i for i, k in enumerate(keys) if k == key[0]]
    # the null key's row reaches no call, as under groupBy
    assert sum(len(frames[0]) for _, frames in calls) == len(keys) - 1


def test_integer_keys_reach_the_processor_as_python_ints():
    calls = run([3, 1, 3])
    assert [key for key, _ in calls] == [(3,), (1,)]
    assert all(type(key[0]) is int for key, _ in calls)


def test_sliding_frames_carry_the_schema_types_empty_or_not():
    rows = [("k", 60_000, 2, 3, 1.5, 4, 2.5, False)]
    frame = _frame(rows)
    assert list(frame.columns) == SLIDING_COLUMNS
    assert frame["window_start"].iloc[0] == pd.Timestamp(60_000, unit="ms")
    assert [str(t) for t in frame.dtypes] == [
        "object", "datetime64[ms]", "int64", "int64", "float64", "int64", "float64", "bool"]
    empty = _frame([])
    assert list(empty.columns) == SLIDING_COLUMNS and len(empty) == 0
    assert [str(t) for t in empty.dtypes] == [str(t) for t in frame.dtypes]


class DropOdd:
    """Drops the rows whose ``seq`` is odd, counting them as duplicates."""

    def init(self, handle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):
        frame = pd.concat(list(rows), ignore_index=True)
        count_duplicates(frame[frame["seq"] % 2 == 1])
        return iter(())

    def close(self) -> None:
        pass


class Foreign(DropOdd):
    """Counts rows that are not rows of its input (a frame of its own)."""

    def handleInputRows(self, key, rows, timerValues):
        count_duplicates(pd.DataFrame({"seq": [1]}, index=[99]))
        return iter(())


def host_of(processor) -> InstanceHost:
    host = InstanceHost(processor, HostSettings(
        key_column="key", key_type=StringType(), user_columns=USER, output_columns=("key",),
        time_mode="EventTime", n_instances=1, labels=(0,), window_ms=10_000))
    host.init(FakeHandle())
    return host


def closed_window(host: InstanceHost, window: int) -> pd.DataFrame:
    """The histogram rows the host emits when ``window``'s end timer fires."""
    frames = list(host.handleExpiredTimer((0,), Times(), ExpiredTimerInfo(window + 10_000)))
    return pd.concat(frames, ignore_index=True)


def test_rows_counted_as_duplicates_count_in_their_window_not_as_the_keys_events():
    host = host_of(DropOdd())
    frame = host_frame(["a", "b", "a", "a", "b", "c"])     # seq 0..5: 1, 3 and 5 dropped
    frame["rb_window"] = [0, 0, 0, 10_000, 10_000, 10_000]
    list(host.handleInputRows((0,), iter([frame]), Times()))

    first = closed_window(host, 0)
    keys = first[first["rb_kind"] == KEY_ROW].set_index("rb_key")
    assert keys["rb_events"].to_dict() == {"a": 2}           # b's one row was a duplicate
    instance = first[first["rb_kind"] == INSTANCE_ROW].iloc[0]
    assert (instance["rb_events"], instance["rb_duplicates"]) == (2, 1)

    second = closed_window(host, 10_000)
    keys = second[second["rb_kind"] == KEY_ROW].set_index("rb_key")
    assert keys["rb_events"].to_dict() == {"b": 1}           # a's and c's rows were
    instance = second[second["rb_kind"] == INSTANCE_ROW].iloc[0]
    assert (instance["rb_events"], instance["rb_duplicates"], instance["rb_keys"]) == (1, 2, 1)


def test_duplicates_add_up_over_batches_and_a_window_of_duplicates_only_closes():
    host = host_of(DropOdd())
    for keys in (["a", "a"], ["b", "b", "b", "b"]):      # 1, then 2 dropped; all in window 0
        list(host.handleInputRows((0,), iter([host_frame(keys)]), Times()))
    only = host_of(DropOdd())
    frame = host_frame(["x", "x"]).iloc[[1]]              # seq 1: its one row is dropped
    list(only.handleInputRows((0,), iter([frame]), Times()))

    instance = closed_window(host, 0).query("rb_kind == @INSTANCE_ROW").iloc[0]
    assert (instance["rb_events"], instance["rb_duplicates"]) == (3, 3)
    rows = closed_window(only, 0)
    assert list(rows["rb_kind"]) == [INSTANCE_ROW]
    assert (rows["rb_events"].iloc[0], rows["rb_duplicates"].iloc[0]) == (0, 1)


def test_rows_that_are_not_the_calls_input_are_refused():
    host = host_of(Foreign())
    with pytest.raises(DuplicatesError, match=r"rows of the frame handleInputRows received.*"
                                              r"\(0\.\.1\); got index values \[99\]"):
        list(host.handleInputRows((0,), iter([host_frame(["a", "a"])]), Times()))


def test_outside_the_host_counting_duplicates_does_nothing():
    count_duplicates(pd.DataFrame({"seq": [1, 2]}))     # plain Spark: no host collects
