"""Per-window instance loads and their imbalance, from the histogram tables.

One computation behind every figure of realised balance: ``verify`` (the DAG),
``rebalance status`` (the CLI) and the Rebalance view's charts. The imbalance of a window is
max load / mean load over the job's N instances (:func:`rebalance.core.model.imbalance`):
an instance that received nothing counts as load 0, not as absent, and a row of an
instance at or above N (written before a change of N) adds to the max but not to the mean.

>>> w = window_loads(spark, n_instances=4, latest=6)         # doctest: +SKIP
>>> w.imbalance()[-1], w.versions[-1]                        # doctest: +SKIP
(1.073, 5)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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

    def _active(self) -> np.ndarray:
        active = np.zeros(self.loads.shape[1], dtype=bool)
        active[:self.n_instances] = True
        return active

    def imbalance(self) -> list[float | None]:
        """Each window's imbalance over the N instances (None for a window with no load)."""
        active = self._active()
        return [float(imbalance(row, active)) if row[active].sum() > 0 else None
                for row in self.loads]

    def total_imbalance(self) -> float:
        """The imbalance of the windows' loads summed (1.0 when there is no load)."""
        return float(imbalance(self.loads.sum(axis=0), self._active()))


def source_table(spark, root: str | Path | None = None) -> tables.Table | None:
    """``instance_histograms`` (N rows a window) when the job wrote it, else
    ``key_histograms`` (a row per key and instance); None when neither exists."""
    for table in (tables.INSTANCE_HISTOGRAMS, tables.KEY_HISTOGRAMS):
        if tables.exists(spark, table, root):
            return table
    return None


def window_loads(spark, n_instances: int | None, latest: int | None = None,
                 starts: Sequence[dt.datetime] | None = None,
                 source: tables.Table | None = None,
                 root: str | Path | None = None) -> WindowLoads:
    """The loads of the ``latest`` windows stored, or of the windows that start at
    ``starts``, summed per instance from ``source`` (default :func:`source_table`).
    ``n_instances`` None: as many as the rows name (the highest instance + 1)."""
    from pyspark.sql import functions as F

    n = max(int(n_instances or 1), 1)
    empty = WindowLoads([], np.zeros((0, n)), [], n)
    if source is None:
        source = source_table(spark, root)          # checks that it exists
    elif not tables.exists(spark, source, root):
        source = None
    if source is None:
        return empty
    df = tables.read(spark, source, root)
    if starts is None:
        if latest is None:
            raise ValueError("window_loads needs latest or starts")
        starts = [r[0] for r in df.select("window_start").distinct()
                  .orderBy(F.col("window_start").desc()).limit(int(latest)).collect()]
    if not starts:
        return empty
    rows = (df.where(F.col("window_start").isin(list(starts)))
            .groupBy("window_start", "instance")
            .agg(F.sum(LOAD_COLUMN[source.name]).alias("load"),
                 F.max("assignment_version").alias("version"))
            .collect())
    windows = sorted({r.window_start for r in rows})
    width = max([n, *(int(r.instance) + 1 for r in rows if r.instance is not None)])
    loads = np.zeros((len(windows), width))
    versions = {w: 0 for w in windows}
    at = {w: i for i, w in enumerate(windows)}
    for r in rows:
        if r.instance is not None and int(r.instance) >= 0:
            loads[at[r.window_start], int(r.instance)] += float(r.load or 0.0)
        versions[r.window_start] = max(versions[r.window_start], int(r.version or 0))
    return WindowLoads(windows, loads, [versions[w] for w in windows],
                       n if n_instances else width)
