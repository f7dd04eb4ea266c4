"""InstanceHost over an in-memory handle: each key's call gets exactly that key's rows, in
the order they came, as a frame of its own (index from 0), and the processor's output
frames carry their schema's types."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pyspark.sql.types import StringType
from test_key_scope import FakeHandle

from rebalance.streaming.host import HostSettings, InstanceHost
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
