"""The built-in computation (sliding count and sum per key, duplicates dropped) as a
processor of its own: the same rows under plain Spark and under rebalanced(), across a
move of the three busiest keys; its final rows are Spark's own ``groupBy(key, window)``
count and sum of the events without their retries."""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import pytest
from api_helpers import T0_MS, run_both

pytestmark = pytest.mark.slow

WINDOW_MS, N_WINDOWS, DELAY_MS = 60_000, 3, 10 * 60_000
HISTOGRAM_MS = 120_000


def _events(n_keys: int = 30, n_phases: int = 2, batches: int = 4, seed: int = 11):
    """Per phase, per batch, 80 events of Zipf-skewed keys over about 4 minutes, about one
    in six a retry of an earlier event (same id, key, value and time), of this batch or an
    earlier one; retries of events the watermark passed are late."""
    rng = np.random.default_rng(seed)
    keys = [f"k{i:02d}" for i in range(n_keys)]
    weights = 1.0 / np.arange(1, n_keys + 1)
    weights /= weights.sum()
    sent: list[tuple] = []
    out, t, serial = [], T0_MS, 0
    for _ in range(n_phases):
        phase = []
        for _ in range(batches):
            rows = []
            for _ in range(80):
                t += int(rng.integers(0, 6_000))
                if sent and rng.random() < 1 / 6:
                    rows.append(sent[int(rng.integers(max(0, len(sent) - 200), len(sent)))])
                    continue
                event = (f"e{serial:05d}", str(rng.choice(keys, p=weights)),
                         float(rng.integers(0, 100)), 1.0, pd.Timestamp(t, unit="ms"))
                serial += 1
                sent.append(event)
                rows.append(event)
            phase.append(pd.DataFrame(rows, columns=["event_id", "key", "value", "cost",
                                                     "event_time"]))
        out.append(phase)
    return out


@pytest.fixture(scope="module")
def sliding(spark, tmp_path_factory):
    from rebalance.streaming.sliding import SLIDING_INPUT, SLIDING_SCHEMA, SlidingWindows

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return run_both(spark, tmp_path_factory.mktemp("sliding"), _events(),
                    make=partial(SlidingWindows, WINDOW_MS, N_WINDOWS, DELAY_MS),
                    in_schema=SLIDING_INPUT, out_schema=SLIDING_SCHEMA, key="key",
                    time_mode="EventTime", event_time="event_time", watermark="event_time",
                    job="sliding", window_seconds=HISTOGRAM_MS // 1000)


def test_sliding_rows_equal_plain_spark(sliding):
    assert len(sliding["plain"]) > 100
    assert sliding["rebalanced"] == sliding["plain"]


def test_final_rows_are_sparks_own_aggregation_without_retries(sliding):
    """Per key and closed window, one final row: the count and sum Spark's batch
    ``dropDuplicates(event_id).groupBy(key, window)`` gives, and their sum over the last
    three windows."""
    events = sliding["inputs"]
    assert events["event_id"].duplicated().sum() > 50, "the input has retries"
    unique = events.drop_duplicates("event_id")
    ms = unique["event_time"].to_numpy().astype("datetime64[ms]").astype(np.int64)
    per = (unique.assign(start=ms - ms % WINDOW_MS).groupby(["key", "start"])["value"]
           .agg(["size", "sum"]))
    watermark = int(ms.max()) - DELAY_MS
    finals = {(k, pd.Timestamp(w).value // 10**6): (c, s, sc, ss)
              for k, w, _, c, s, sc, ss, final in sliding["rebalanced"] if final}
    expected = {}
    for (key, start), (count, total) in per.iterrows():
        if start + WINDOW_MS > watermark:
            continue
        last = [per.loc[(key, w)] for w in range(start - (N_WINDOWS - 1) * WINDOW_MS,
                                                 start + 1, WINDOW_MS) if (key, w) in per.index]
        expected[(key, int(start))] = (int(count), float(total), int(sum(r["size"] for r in last)),
                                       float(sum(r["sum"] for r in last)))
    assert len(expected) > 50
    assert finals == expected


def test_the_moved_keys_state_moved_once(sliding):
    from rebalance.streaming.rebalanced import payload_of

    control = sliding["control"]
    moved = sorted(payload_of(r)["key"] for r in control[control["kind"] == "in"].itertuples())
    assert moved == sorted(sliding["moves"])
    assert sliding["switched_to"] == sliding["version"]


def test_dropped_retries_count_as_their_windows_duplicates_not_as_events(sliding):
    """``count_duplicates``: per closed histogram window, the instances' events are the
    window's distinct events, and their duplicates the retries the processor dropped: at
    least every retry sent in the same micro-batch as its event (never late), at most
    every retry (one whose event the watermark passed is late: Spark drops it first)."""
    events, hist = sliding["inputs"], sliding["instances"]
    ms = events["event_time"].to_numpy().astype("datetime64[ms]").astype(np.int64)
    frame = np.cumsum(events.index == 0)                 # each written frame's index is 0..79
    retry = events["event_id"].duplicated().to_numpy()
    first_frame = pd.Series(frame).groupby(events["event_id"].to_numpy()).transform("first")
    per = (events.assign(start=ms - ms % HISTOGRAM_MS, retry=retry,
                         on_time=retry & (frame == first_frame.to_numpy()))
           .groupby("start").agg(distinct=("event_id", "nunique"), retries=("retry", "sum"),
                                 on_time=("on_time", "sum")))
    starts = hist["window_start"].to_numpy().astype("datetime64[ms]").astype(np.int64)
    got = hist.assign(start=starts).groupby("start")[["events", "duplicates"]].sum()
    assert hist["duplicates"].notna().all()
    closed = per.loc[got.index]
    assert got["events"].tolist() == closed["distinct"].tolist()
    assert closed["on_time"].sum() > 20 and got["duplicates"].sum() > 50, got.join(closed)
    assert (got["duplicates"] >= closed["on_time"]).all(), got.join(closed)
    assert (got["duplicates"] <= closed["retries"]).all(), got.join(closed)
