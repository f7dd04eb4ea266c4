"""Per-window instance loads and their imbalance, from the histogram tables.

One computation behind every figure of realised balance: ``verify`` (the DAG),
``rebalance status`` (the CLI) and the Rebalance view's charts. The imbalance of a window is
max load / mean load over the job's N instances (:func:`rebalance.core.model.imbalance`):
an instance that received nothing counts as load 0, not as absent, and a row of an
instance at or above N (written before a change of N) adds to the max but not to the mean.

>>> w = window_loads(spark, n_instances=4, latest=6)         # doctest: +SKIP
>>> w.imbalances()[-1], w.versions[-1]                        # doctest: +SKIP
(1.073, 5)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rebalance.core.model import imbalance
from rebalance.spark import tables

#: The column that holds the load, per histogram table.
LOAD_COLUMN = {tables.INSTANCE_HISTOGRAMS.name: "load", tables.KEY_HISTOGRAMS.name: "cost"}


@dataclass(frozen=True)
class WindowLoads:
    """Loads per window (oldest first) and instance, with each window's assignment version."""

    windows: list[dt.datetime]
    #: shape (windows, max(N, highest instance + 1))
    loads: np.ndarray
    #: the highest assignment version among each window's rows
    versions: list[int]
    n_instances: int

    @property
    def active(self) -> np.ndarray:
        """Mask of the job's N instances among the columns (a column at or above N holds
        rows written before a change of N)."""
        active = np.zeros(self.loads.shape[1], dtype=bool)
        active[:self.n_instances] = True
        return active

    def imbalances(self) -> list[float | None]:
        """Each window's :func:`~rebalance.core.model.imbalance` over the N instances (None
        for a window with no load)."""
        active = self.active
        values = imbalance(self.loads, active) if len(self.loads) else []
        return [float(v) if row[active].sum() > 0 else None
                for v, row in zip(values, self.loads)]


def source_table(spark, root: str | Path | None = None) -> tables.Table | None:
    """``instance_histograms`` (N rows a window) when the job wrote it, else
    ``key_histograms`` (a row per key and instance); None when neither exists."""
    for table in (tables.INSTANCE_HISTOGRAMS, tables.KEY_HISTOGRAMS):
        if tables.exists(spark, table, root):
            return table
    return None


def newest_windows(spark, n: int, source: tables.Table = tables.KEY_HISTOGRAMS,
                   version: int | None = None, root: str | Path | None = None,
                   ) -> list[dt.datetime]:
    """Starts of the ``n`` newest windows of a histogram table (at ``version`` if given),
    oldest first, as naive UTC datetimes; empty when it does not exist."""
    seen = tables.read_pandas(spark, source, root, version=version, columns=["window_start"])
    if seen is None or n <= 0:
        return []
    starts = seen["window_start"].drop_duplicates().sort_values()   # without a Python loop
    return [_datetime(w) for w in starts.iloc[-int(n):]]


def histogram_rows(spark, windows: Sequence | None = None, version: int | None = None,
                   root: str | Path | None = None):
    """The ``key_histograms`` rows of ``windows`` (all when None; at ``version`` if given) merged per
    (window, key): ``window_start, key, count, cost, state_bytes`` (count and cost summed
    over the key's instances and batches, state bytes their maximum): what every plan,
    trigger and rollback reads. None when the table does not exist."""
    pdf = tables.read_pandas(spark, tables.KEY_HISTOGRAMS, root, version=version,
                             columns=["window_start", "key", "count", "cost", "state_bytes"],
                             filters=None if windows is None else [
                                 ("window_start", "in", list(windows))])
    if pdf is None:
        return None
    return (pdf.groupby(["window_start", "key"], as_index=False, sort=False)
            .agg(count=("count", "sum"), cost=("cost", "sum"), state_bytes=("state_bytes", "max")))


def window_loads(spark, n_instances: int | None, latest: int | None = None,
                 starts: Sequence[dt.datetime] | None = None,
                 source: tables.Table | None = None,
                 root: str | Path | None = None) -> WindowLoads:
    """The loads of the ``latest`` windows stored, or of the windows that start at
    ``starts``, summed per instance from ``source`` (default :func:`source_table`).
    ``n_instances`` None: as many as the rows name (the highest instance + 1)."""
    n = max(int(n_instances or 1), 1)
    empty = WindowLoads([], np.zeros((0, n)), [], n)
    if source is None:
        source = source_table(spark, root)          # checks that it exists
    elif not tables.exists(spark, source, root):
        source = None
    if source is None:
        return empty
    if starts is None:
        if latest is None:
            raise ValueError("window_loads needs latest or starts")
        starts = newest_windows(spark, int(latest), source, root=root)
    if not starts:
        return empty
    pdf = tables.read_pandas(spark, source, root,
                             columns=["window_start", "instance", LOAD_COLUMN[source.name],
                                      "assignment_version"],
                             filters=[("window_start", "in", list(starts))])
    windows = sorted(_datetime(w) for w in set(pdf["window_start"]))
    width = max([n, *(int(i) + 1 for i in pdf["instance"].dropna())])
    loads = np.zeros((len(windows), width))
    versions = {w: 0 for w in windows}
    at = {w: i for i, w in enumerate(windows)}
    for (start, instance), group in pdf.groupby(["window_start", "instance"], dropna=False):
        w = _datetime(start)
        if not pd.isna(instance) and int(instance) >= 0:
            loads[at[w], int(instance)] += float(group[LOAD_COLUMN[source.name]].sum())
        top = group["assignment_version"].max()
        versions[w] = max(versions[w], 0 if pd.isna(top) else int(top))
    return WindowLoads(windows, loads, [versions[w] for w in windows],
                       n if n_instances else width)


def _datetime(value) -> dt.datetime:
    """A window start as Spark's rows give it: a naive UTC ``datetime``."""
    return value.to_pydatetime() if hasattr(value, "to_pydatetime") else value
