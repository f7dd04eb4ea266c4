"""Key histograms -> planning problem: read, validate, aggregate.

Input rows (one or more per window and key) have the columns

* ``window_start`` (timestamp), ``key`` (string), ``count`` (int64, events),
* optionally ``cost`` (double, default ``count``) and ``state_bytes`` (int64, default
  ``count``); any other column (the streaming job's ``key_histograms`` table also has
  ``instance, default_instance, key_group, partition_id, assignment_version, batch_id``)
  is ignored.

Aggregation (the same choices as :func:`rebalance.pipeline.load_problem`):

* several rows of one (window, key) are merged: ``count`` and ``cost`` are summed,
  ``state_bytes`` takes the maximum (rows of one window are partial reports of the
  same key state, e.g. one per micro-batch or per instance after a move);
* only the last ``windows`` distinct windows are planned over (all of them if fewer exist);
* load of a key = **mean** cost per window over those windows (a window in which the
  key is absent counts 0), so loads keep the unit "cost per window" whatever W is;
* state of a key = its ``state_bytes`` in the **latest** of those windows in which it
  appears: the job keeps a sliding window of state and reports what a key holds at each
  window close, so the latest report is what a migration would move (seed 003 S(k, w));
* keys seen only before the planned windows, and keys only in the assignment file, are
  still planned (every key of the input gets an instance) with load 0 and state 0.

Current instance of a key = the assignment file's instance, else the default placement
(:func:`rebalance.placement.default_instances`). Keys are sorted, so the problem (and a
deterministic planner's plan) depends only on the input's content, not on row order.

Pure pandas/pyarrow/numpy; Spark is imported lazily and only for a Delta table directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .model import PlanningError, Problem
from .placement import default_instances, key_groups

REQUIRED = ("window_start", "key", "count")
OPTIONAL = ("cost", "state_bytes")


class InputError(PlanningError):
    """Unreadable or invalid histogram/assignment input (one line, exit code 2 in the CLI)."""


# ---------------------------------------------------------------------- reading
def _is_delta(path: Path) -> bool:
    return path.is_dir() and (path / "_delta_log").is_dir()


def read_histograms(path: str | Path) -> pd.DataFrame:
    """Rows of a Delta table directory, a Parquet file/directory or a CSV file."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"histograms path not found: {path}")
    if _is_delta(path):
        return _read_delta(path)
    if path.is_file() and path.suffix.lower() == ".csv":
        return _read_csv(path, "histograms")
    return _read_parquet(path, "histograms")


def _read_delta(path: Path) -> pd.DataFrame:
    from .spark.session import get_spark

    try:
        spark = get_spark("rebalance-plan")
        df = spark.read.format("delta").load(str(path.resolve()))
    except Exception as exc:  # noqa: BLE001 - any Spark/Delta failure is a bad input here
        raise InputError(f"cannot read Delta table {path}: {_first_line(exc)}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(_missing_message("histograms", missing, df.columns))
    cols = [c for c in (*REQUIRED, *OPTIONAL) if c in df.columns]
    # Merge (window, key) duplicates in Spark already: far fewer rows reach pandas.
    from pyspark.sql import functions as F

    aggs = [F.sum("count").alias("count")]
    if "cost" in cols:
        aggs.append(F.sum("cost").alias("cost"))
    if "state_bytes" in cols:
        aggs.append(F.max("state_bytes").alias("state_bytes"))
    # Spark's sum/max skip nulls: keep null and negative detection by counting them.
    aggs.append(F.sum(F.when(_bad_expr(F, cols), 1).otherwise(0)).alias("_bad"))
    pdf = df.groupBy("window_start", "key").agg(*aggs).toPandas()
    bad = pdf.pop("_bad")
    if len(pdf) and (bad > 0).any():
        row = pdf[bad > 0].iloc[0]
        raise InputError(f"histograms hold negative, NaN or missing values: key {row['key']!r} "
                         f"in window {row['window_start']} "
                         f"({int((bad > 0).sum())} bad key-window(s))")
    return pdf


def _bad_expr(F, cols):
    expr = None
    for c in cols:
        if c in ("window_start", "key"):
            e = F.col(c).isNull()
        else:
            e = F.col(c).isNull() | F.isnan(F.col(c).cast("double")) | (F.col(c) < 0)
        expr = e if expr is None else (expr | e)
    return expr


def _read_parquet(path: Path, what: str) -> pd.DataFrame:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(str(path)).to_pandas()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise InputError(f"cannot read {what} {path} as Parquet: {_first_line(exc)}") from None


def _read_csv(path: Path, what: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype={"key": str})
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"cannot read {what} {path} as CSV: {_first_line(exc)}") from None


def read_assignment(path: str | Path) -> pd.DataFrame:
    """A current assignment file (Parquet or CSV, columns ``key`` and ``instance``)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"assignment path not found: {path}")
    if path.is_file() and path.suffix.lower() == ".csv":
        return _read_csv(path, "assignment")
    return _read_parquet(path, "assignment")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _missing_message(what: str, missing, have) -> str:
    return (f"{what} lack required column(s) {', '.join(repr(m) for m in missing)} "
            f"(have: {', '.join(map(str, have)) or 'none'})")


# ------------------------------------------------------------------- validating
def _numeric(frame: pd.DataFrame, col: str, what: str) -> np.ndarray:
    values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = frame[col].iloc[i]
        where = f"key {frame['key'].iloc[i]!r}" if "key" in frame else f"row {i}"
        if "window_start" in frame:
            where += f" in window {frame['window_start'].iloc[i]}"
        raise InputError(f"{what} column {col!r} must be finite and >= 0: {where} has {raw!r} "
                         f"({int(bad.sum())} bad value(s))")
    return values


def validate_histograms(frame: pd.DataFrame) -> pd.DataFrame:
    """Checked, typed rows ``window_start, key, count, cost, state_bytes`` (duplicates kept)."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise InputError(_missing_message("histograms", missing, frame.columns))
    if len(frame) == 0:
        raise InputError("histograms are empty: no windows to plan over")
    if frame["key"].isna().any():
        raise InputError(f"histograms hold {int(frame['key'].isna().sum())} row(s) without a key")
    try:
        ws = pd.to_datetime(frame["window_start"], utc=True)
    except (ValueError, TypeError) as exc:
        raise InputError(f"histograms column 'window_start' is not a timestamp: "
                         f"{_first_line(exc)}") from None
    if ws.isna().any():
        raise InputError(f"histograms hold {int(ws.isna().sum())} row(s) without a window_start")
    out = pd.DataFrame({"window_start": ws.dt.tz_localize(None).to_numpy(),
                        "key": frame["key"].astype(str).to_numpy()})
    out["count"] = _numeric(frame, "count", "histograms")
    out["cost"] = _numeric(frame, "cost", "histograms") if "cost" in frame else out["count"]
    out["state_bytes"] = (_numeric(frame, "state_bytes", "histograms")
                          if "state_bytes" in frame else out["count"])
    return out


def validate_assignment(frame: pd.DataFrame, n_instances: int) -> pd.DataFrame:
    """Checked ``key`` (str) -> ``instance`` (int64 in [0, N)) rows, keys unique."""
    missing = [c for c in ("key", "instance") if c not in frame.columns]
    if missing:
        raise InputError(_missing_message("assignment", missing, frame.columns))
    if frame["key"].isna().any():
        raise InputError(f"assignment holds {int(frame['key'].isna().sum())} row(s) without a key")
    keys = frame["key"].astype(str)
    dup = keys[keys.duplicated(keep=False)]
    if len(dup):
        names = sorted(set(dup))
        raise InputError(f"assignment lists {len(names)} key(s) more than once, e.g. "
                         f"{', '.join(repr(k) for k in names[:3])}")
    inst = pd.to_numeric(frame["instance"], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(inst) | (inst != np.round(inst)) | (inst < 0) | (inst >= n_instances)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"assignment instance of key {keys.iloc[i]!r} is "
                         f"{frame['instance'].iloc[i]!r}, outside the integers [0, {n_instances}) "
                         f"({int(bad.sum())} bad row(s))")
    return pd.DataFrame({"key": keys.to_numpy(dtype=object), "instance": inst.astype(np.int64)})


# ------------------------------------------------------------------ aggregating
def build_problem(frame: pd.DataFrame, n_instances: int, assignment: pd.DataFrame | None = None,
                  windows: int = 1) -> tuple[Problem, dict[str, Any]]:
    """The planning problem of histogram rows, and a JSON-ready summary of the input."""
    if isinstance(n_instances, bool) or int(n_instances) != n_instances or n_instances < 1:
        raise InputError(f"number of instances must be an integer >= 1, got {n_instances!r}")
    n_instances = int(n_instances)
    if int(windows) != windows or windows < 1:
        raise InputError(f"windows must be an integer >= 1, got {windows!r}")
    rows = validate_histograms(frame)
    assign = None if assignment is None else validate_assignment(assignment, n_instances)

    all_windows = np.sort(rows["window_start"].unique())
    chosen = all_windows[-int(windows):]
    sel = rows[rows["window_start"] >= chosen[0]]
    merged = (sel.groupby(["window_start", "key"], sort=False)
              .agg(count=("count", "sum"), cost=("cost", "sum"), state_bytes=("state_bytes", "max"))
              .reset_index())

    key_sets = [pd.unique(rows["key"])]
    if assign is not None:
        key_sets.append(assign["key"].to_numpy(dtype=object))
    keys = np.sort(pd.unique(np.concatenate(key_sets)).astype(str)).astype(object)
    k = len(keys)
    w = len(chosen)
    ki = np.searchsorted(keys.astype(str), merged["key"].to_numpy(dtype=str))
    wi = np.searchsorted(chosen, merged["window_start"].to_numpy())
    cost = merged["cost"].to_numpy(dtype=np.float64)
    series = np.zeros((w, k))
    series[wi, ki] = cost  # (window, key) pairs are unique after the merge
    state = np.zeros(k)
    order = np.lexsort((wi, ki))  # by key, then window: the last of each key is its latest
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ki[order][1:] != ki[order][:-1]
    state[ki[order][last]] = merged["state_bytes"].to_numpy(dtype=np.float64)[order][last]

    default = default_instances(keys, n_instances)
    current = default.copy()
    n_listed = 0
    if assign is not None and len(assign):
        pos = np.searchsorted(keys.astype(str), assign["key"].to_numpy(dtype=str))
        current[pos] = assign["instance"].to_numpy()
        n_listed = len(assign)
    problem = Problem(keys=keys, load=series.sum(axis=0) / w, state=state, current=current,
                      default=default, n_instances=n_instances, load_series=series,
                      key_group=key_groups(keys))
    summary = {
        "rows": int(len(rows)),
        "keys": int(k),
        "histogram_keys": int(len(key_sets[0])),
        "planned_window_keys": int(len(np.unique(ki))),
        "assignment_keys": int(n_listed),
        "keys_off_default": int((current != default).sum()),
        "windows_available": int(len(all_windows)),
        "windows_requested": int(windows),
        "windows_used": int(w),
        "windows": [pd.Timestamp(t).tz_localize("UTC").isoformat()
                    if pd.Timestamp(t).tzinfo is None else pd.Timestamp(t).isoformat()
                    for t in chosen],
        "total_events": float(merged["count"].sum()),
        "total_load": float(problem.load.sum()),
        "total_state_bytes": float(state.sum()),
        "load": "mean cost per window over the planned windows",
        "state": "state_bytes of the latest planned window the key appears in",
    }
    return problem, summary


def problem_from_histograms(frame: pd.DataFrame, n_instances: int,
                            assignment: pd.DataFrame | None = None, windows: int = 1) -> Problem:
    """The planning problem of histogram rows (see the module docstring for the choices)."""
    return build_problem(frame, n_instances, assignment, windows)[0]


def load_input(histograms: str | Path, n_instances: int, assignment_path: str | Path | None = None,
               windows: int = 1) -> tuple[Problem, dict[str, Any]]:
    """Read and aggregate the files of ``rebalance plan``."""
    frame = read_histograms(histograms)
    assignment = None if assignment_path is None else read_assignment(assignment_path)
    problem, summary = build_problem(frame, n_instances, assignment, windows)
    path = Path(histograms)
    summary["histograms_format"] = ("delta" if _is_delta(path) else
                                    "csv" if path.suffix.lower() == ".csv" else "parquet")
    return problem, summary
