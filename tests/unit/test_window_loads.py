"""Imbalance of per-window instance loads over the job's N instances
(rebalance.spark.loads.WindowLoads): an idle instance counts 0, an instance at or above N
adds to the max only, a window with no load has none. Read from Delta in
tests/integration/test_loads_spark.py."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from rebalance.core.model import imbalance
from rebalance.spark.loads import WindowLoads


def _at(minute: int) -> dt.datetime:
    return dt.datetime(2026, 11, 28, 12, minute, tzinfo=dt.timezone.utc)


def test_each_window_is_judged_over_the_n_instances_and_an_idle_one_counts_zero():
    w = WindowLoads([_at(0), _at(1), _at(2)],
                    np.array([[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]),
                    [1, 1, 2], 4)
    assert w.imbalances() == [3.0, None, 1.0]           # 3 / mean(3, 1, 0, 0) = 3
    # verify's figure: the windows' loads summed (5, 3, 2, 2), over the N instances
    assert imbalance(w.loads.sum(axis=0), w.active) == pytest.approx(5.0 / (12.0 / 4))


def test_an_instance_beyond_n_adds_to_the_max_but_not_to_the_mean():
    w = WindowLoads([_at(0)], np.array([[1.0, 1.0, 1.0, 1.0, 4.0]]), [3], 4)
    assert w.imbalances() == [4.0]                       # 4 / mean of the first four (1)
    assert WindowLoads([], np.zeros((0, 4)), [], 4).imbalances() == []
    empty = WindowLoads([], np.zeros((0, 4)), [], 4)
    assert imbalance(empty.loads.sum(axis=0), empty.active) == 1.0
