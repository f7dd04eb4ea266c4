"""Per-window instance loads read from the histogram tables (rebalance.spark.loads, local
Spark + Delta), against a pandas recomputation of the same rows: the latest windows or
given ones, ``instance_histograms`` first, ``key_histograms`` when the job wrote no
instance rows; the view's chart and ``rebalance status`` give the same figures."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow

N = 4


def _rows() -> pd.DataFrame:
    """Key rows of 5 windows; instance 3 idle in every window, instance 4 (>= N, a row
    written before N changed) in the last one; versions 1, 1, 2, 2, 3."""
    rng = np.random.default_rng(7)
    out = []
    for w in range(5):
        start = dt.datetime(2026, 3, 2, 12, 0) + dt.timedelta(seconds=20 * w)
        for k in range(30):
            instance = 4 if (w == 4 and k == 0) else k % 3
            out.append((start, f"k{k}", int(rng.integers(1, 9)), float(rng.uniform(0.5, 3.0)),
                        100, instance, k % 3, k, instance, (1, 1, 2, 2, 3)[w], w))
    cols = ["window_start", "key", "count", "cost", "state_bytes", "instance",
            "default_instance", "key_group", "partition_id", "assignment_version", "batch_id"]
    return pd.DataFrame(out, columns=cols)


def _expected(rows: pd.DataFrame, starts) -> tuple[list, list]:
    sel = rows[rows["window_start"].isin(starts)]
    imbalances, versions = [], []
    for _, g in sel.groupby("window_start"):
        loads = g.groupby("instance")["cost"].sum().reindex(range(5), fill_value=0.0).to_numpy()
        imbalances.append(loads.max() / (loads[:N].sum() / N))
        versions.append(int(g["assignment_version"].max()))
    return imbalances, versions


def test_window_loads_equal_a_pandas_recomputation_from_either_histogram_table(spark, tmp_path):
    from rebalance.core.model import imbalance
    from rebalance.spark import tables
    from rebalance.spark.loads import source_table, window_loads

    root = str(tmp_path / "tables")
    rows = _rows()
    assert window_loads(spark, N, latest=3, root=root).windows == []      # nothing yet
    tables.ensure_table(spark, tables.KEY_HISTOGRAMS, root)
    tables.append(spark.createDataFrame(rows, tables.KEY_HISTOGRAMS.schema),
                  tables.KEY_HISTOGRAMS, root)
    assert source_table(spark, root) is tables.KEY_HISTOGRAMS
    starts = sorted(rows["window_start"].unique())
    want, versions = _expected(rows, starts[-3:])
    got = window_loads(spark, N, latest=3, root=root)
    assert [w.replace(tzinfo=None) for w in got.windows] == [pd.Timestamp(s).to_pydatetime()
                                                            for s in starts[-3:]]
    assert got.imbalances() == pytest.approx(want) and got.versions == versions
    assert got.loads.shape == (3, 5) and (got.loads[:, 3] == 0).all()   # idle instance 3
    # given windows, summed: what verify judges
    two = window_loads(spark, N, starts=[pd.Timestamp(s).to_pydatetime() for s in starts[:2]],
                       root=root)
    summed = rows[rows["window_start"].isin(starts[:2])].groupby("instance")["cost"].sum()
    summed = summed.reindex(range(N), fill_value=0.0).to_numpy()
    assert imbalance(two.loads.sum(axis=0), two.active) == pytest.approx(summed.max() / summed.mean())
    # the job's instance rows, when there are some, are read instead (N rows a window)
    inst = (rows.groupby(["window_start", "instance"])
            .agg(load=("cost", "sum"), events=("count", "sum"), keys=("key", "count"),
                 version=("assignment_version", "max")).reset_index())
    irows = [(r.window_start.to_pydatetime(), int(r.instance), float(r.load), int(r.events), int(r.keys), 0.0,
              0.0, int(r.instance), int(r.version), 0, 0) for r in inst.itertuples()]
    tables.ensure_table(spark, tables.INSTANCE_HISTOGRAMS, root)
    tables.append(spark.createDataFrame(irows, tables.INSTANCE_HISTOGRAMS.schema),
                  tables.INSTANCE_HISTOGRAMS, root)
    assert source_table(spark, root) is tables.INSTANCE_HISTOGRAMS
    again = window_loads(spark, N, latest=3, root=root)
    assert again.imbalances() == pytest.approx(want) and again.versions == versions
