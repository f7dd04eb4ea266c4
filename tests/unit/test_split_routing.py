"""Split keys in the routing table, without Spark: the checks of what may be published
(:mod:`rebalance.core.assignment`) and the per-event choice of a share
(:func:`rebalance.core.placement.split_instances`; the Spark side is compared with it in
``tests/integration/test_streaming.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from rebalance.core.assignment import (
    AssignmentError,
    primary_instance,
    validate_routing,
    validate_splits,
)
from rebalance.core.placement import SPLIT_POINTS, share_bounds, split_instances, split_points


def test_valid_splits_come_back_sorted_and_scaled_to_sum_to_one():
    got = validate_splits({"k": {2: 0.3, 0: 0.7 + 1e-7}}, 4)
    assert list(got) == ["k"] and list(got["k"]) == [0, 2]
    assert sum(got["k"].values()) == pytest.approx(1.0, abs=1e-15)
    assert validate_splits(None, 4) == {} and validate_splits({}, 4) == {}


@pytest.mark.parametrize("splits, message", [
    ({"k": {0: 1.0}}, "at least two instances"),
    ({"k": [0, 1]}, "at least two instances"),
    ({"": {0: 0.5, 1: 0.5}}, "non-empty strings"),
    ({"k": {0: 0.5, 4: 0.5}}, r"instance 4 is not an integer in \[0, 4\)"),
    ({"k": {0: 0.5, -1: 0.5}}, "instance -1"),
    ({"k": {0: 0.5, True: 0.5}}, "instance True"),
    ({"k": {0: 0.5, "1": 0.5}}, "instance '1'"),
    ({"k": {0: 1.0, 1: 0.0}}, "share of instance 1 must be > 0"),
    ({"k": {0: 1.5, 1: -0.5}}, "share of instance 1 must be > 0"),
    ({"k": {0: 0.5, 1: float("nan")}}, "must be > 0, got nan"),
    ({"k": {0: 0.5, 1: "half"}}, "must be > 0"),
    ({"k": {0: 0.5, 1: 0.4}}, "shares sum to 0.9, not 1"),
])
def test_bad_splits_are_refused_with_the_reason(splits, message):
    with pytest.raises(AssignmentError, match=message):
        validate_splits(splits, 4)


def test_whole_routing_checks_are_unchanged():
    assert validate_routing({"b": 1, "a": 0}, 2) == {"a": 0, "b": 1}
    with pytest.raises(AssignmentError, match="outside"):
        validate_routing({"a": 2}, 2)


def test_the_primary_is_the_largest_share_then_the_lowest_instance():
    assert primary_instance({0: 0.2, 3: 0.5, 1: 0.3}) == 3
    assert primary_instance({2: 0.5, 1: 0.5}) == 1


def test_points_are_spark_hash_mod_2_20():
    points = split_points(["e-1", "e-2", "événement"])
    assert points.dtype == np.int64
    assert ((points >= 0) & (points < SPLIT_POINTS)).all()
    # the same id always gets the same point (a retry or a replay goes to the same share)
    assert (split_points(["e-2", "e-1"]) == points[[1, 0]]).all()


def test_share_ranges_cover_every_point_once_in_instance_order():
    bounds = share_bounds([0.5, 0.3, 0.2])
    assert bounds.tolist() == [SPLIT_POINTS // 2, int(0.8 * SPLIT_POINTS + 0.5), SPLIT_POINTS]
    points = np.arange(SPLIT_POINTS)
    chosen = split_instances(points, [0, 2, 5], [0.5, 0.3, 0.2])
    counts = {i: int((chosen == i).sum()) for i in (0, 2, 5)}
    assert sum(counts.values()) == SPLIT_POINTS
    assert counts[0] == SPLIT_POINTS // 2
    assert abs(counts[2] / SPLIT_POINTS - 0.3) < 1e-6 and abs(counts[5] / SPLIT_POINTS - 0.2) < 1e-6
    assert chosen[0] == 0 and chosen[-1] == 5
    # a cumulative sum just below 1 still sends the last points to the last instance
    assert split_instances([SPLIT_POINTS - 1], [1, 2], [0.1, 0.9 - 1e-12])[0] == 2


def test_event_ids_spread_over_the_shares():
    ids = [f"event-{i}" for i in range(20_000)]
    chosen = split_instances(split_points(ids), [0, 1], [0.75, 0.25])
    assert abs((chosen == 0).mean() - 0.75) < 0.02


def test_frame_loads_count_a_split_key_by_its_shares():
    import pandas as pd

    from rebalance.core.records import frame_loads

    frame = pd.DataFrame({"key": ["a", "b", "c"], "instance": [1, 0, 2], "current": [0, 0, 1],
                          "load": [8.0, 2.0, 1.0],
                          "split": ['{"1": 0.75, "2": 0.25}', None, None]})
    assert frame_loads(frame, 3) == [2.0, 6.0, 3.0]
    assert frame_loads(frame, 3, "current") == [10.0, 1.0, 0.0]
    assert frame_loads(frame.drop(columns="split"), 3) == [2.0, 8.0, 1.0]


def test_the_trigger_sees_a_live_split_key_by_its_shares():
    import pandas as pd

    from rebalance.control.inputs import window_history
    from rebalance.core.placement import default_instances

    keys = ["hot", "a", "b", "c"]
    rows = pd.DataFrame({"window_start": pd.Timestamp("2026-01-01", tz="UTC"), "key": keys,
                         "count": [60, 10, 10, 20], "cost": [60.0, 10.0, 10.0, 20.0],
                         "state_bytes": [100, 10, 10, 10]})
    routing = {k: i for k, i in zip(keys[1:], (0, 1, 1))}
    whole, current = window_history(rows, 2, routing)
    loads = np.bincount(current, weights=whole.loads[0], minlength=2)
    hot = int(default_instances(["hot"], 2)[0])
    assert loads[hot] >= 60
    split, current = window_history(rows, 2, routing, {"hot": {0: 0.5, 1: 0.5}})
    assert len(split.keys) == 5 and sorted(k for k in split.keys if "hot" in k) == [
        "hot\x1f0", "hot\x1f1"]
    assert np.bincount(current, weights=split.loads[0], minlength=2).tolist() == [40.0, 60.0]


def test_the_assignment_frame_of_a_split_plan_moves_a_key_only_off_all_its_shares():
    from rebalance.control.inputs import assignment_frame
    from rebalance.core.model import Problem
    from rebalance.core.records import frame_splits

    problem = Problem(keys=np.array(["a", "b", "c"], dtype=object), load=np.array([8.0, 4, 1]),
                      state=np.array([1.0, 1, 1]), current=np.array([0, 2, 1]),
                      default=np.array([0, 2, 1]), n_instances=3)
    frame = assignment_frame(problem, np.array([1, 0, 1]),
                             {"a": {1: 0.6, 0: 0.4}, "b": {0: 0.5, 1: 0.5}})
    assert frame["moved"].tolist() == [False, True, False]   # a keeps a share on 0
    assert frame_splits(frame) == {"a": {0: 0.4, 1: 0.6}, "b": {0: 0.5, 1: 0.5}}
    assert frame["split"].isna().tolist() == [False, False, True]


def test_a_split_key_is_moved_only_when_no_share_stays_on_its_current_instance():
    from rebalance.core.records import moved_mask

    keys = np.array(["a", "b", "c", "d"], dtype=object)
    instance, current = np.array([0, 1, 2, 3]), np.array([0, 2, 1, 3])
    assert moved_mask(keys, instance, current).tolist() == [False, True, True, False]
    splits = {"b": {1: 0.5, 2: 0.5},        # keeps a share on its current instance 2
              "d": {0: 0.6, 1: 0.4}}        # leaves instance 3 entirely
    assert moved_mask(keys, instance, current, splits).tolist() == [False, False, True, True]
    assert moved_mask(keys, instance, current, {}).tolist() == [False, True, True, False]


def test_the_gate_recomputes_split_metrics_over_the_rows_it_is_given_only():
    import pandas as pd

    from rebalance.control.validation import recompute_metrics_independently
    from rebalance.core.records import SPLIT_COLUMN, split_text

    frame = pd.DataFrame({"key": ["a", "b"], "instance": [0, 1], "current": [0, 1],
                          "default": [0, 1], "load": [4.0, 2.0], "state": [1.0, 1.0],
                          "moved": [False, False],
                          SPLIT_COLUMN: [split_text({0: 0.5, 1: 0.5}), None]})
    splits = {"a": {0: 0.5, 1: 0.5}, "gone": {0: 0.5, 1: 0.5}}   # parsed before a row was dropped
    given = recompute_metrics_independently(frame, 2, splits=splits)
    assert given == recompute_metrics_independently(frame, 2)
    assert given["table_size"] == 2
