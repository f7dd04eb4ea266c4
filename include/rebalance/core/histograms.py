"""Key histograms -> planning problem: read, validate, aggregate.

Rows (``window_start``, ``key``, ``count``, optionally ``cost`` and ``state_bytes``; one
or more per window and key) become a :class:`rebalance.core.model.Problem` with the same
choices as :func:`rebalance.control.inputs.load_problem`: over the last ``windows``
distinct windows a key's load is its **mean** cost per window (absent = 0) and its state
its ``state_bytes`` in the **latest** window in which it appears (what a migration would
move); rows of one (window, key) are merged (costs summed, state the maximum). Keys not in
the assignment are on their default placement (:mod:`rebalance.core.placement`) and keys
are sorted by their UTF-8 bytes, so the problem does not depend on row order. Every column
is checked before any work (:class:`InputError`, one line). The choices in full, and how
this stays fast at 10^6-10^7 keys: ``docs/planning.md``, "Aggregation" and "Scale".
Pure pyarrow/numpy (pandas for pandas input, CSV timestamps that need parsing and the
DataFrame helpers); Spark is imported lazily, only for a Delta table directory.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rebalance.core.histogram_files import (
    REQUIRED,
    InputError,
    first_line,
    is_delta,
    missing_message,
    read_assignment_table,
    read_histogram_table,
)
from rebalance.core.key_order import python_strings, refuse_duplicates, sorted_keys
from rebalance.core.model import MAX_INSTANCES, Problem
from rebalance.core.placement import group_instances, key_groups

#: Largest total of a numeric column (2^53): up to it float64 sums of integer counts and
#: bytes are exact, so the loads, totals and migration bytes of ``plan.json`` are too;
#: beyond it (a cost of 1e308 overflows the sum to inf) metrics become NaN or meaningless.
#: 2^53 bytes is 9 PB of state, 2^53 ns of cost 104 days per window.
MAX_TOTAL = float(2 ** 53)
#: Largest windows x keys matrix built (2^27 cells, 1 GiB of float64). A problem keeps its
#: per-window load series (``Problem.load_series``, used by CLB only) up to it; beyond it
#: the load comes from the rows directly and the series is omitted (CLB then falls back
#: to ELB), so 10^6 keys x 2 000 windows plans without a 15 GiB matrix. A replay
#: (:func:`window_matrices`) needs two such matrices and is refused above it.
MAX_SERIES_CELLS = 2 ** 27


# ------------------------------------------------------------------- columns
def _is_arrow(frame) -> bool:
    return hasattr(frame, "column_names") and hasattr(frame, "num_rows")


def _names(frame) -> list:
    return list(frame.column_names) if _is_arrow(frame) else list(frame.columns)


def _n_rows(frame) -> int:
    return frame.num_rows if _is_arrow(frame) else len(frame)


def _raw(col, i: int):
    """The input's own value at row i (for messages)."""
    return col[i].as_py() if hasattr(col, "type") else col.iloc[i]


def _key_array(col, what: str):
    """Keys as a pyarrow large_string array (no nulls: counted and refused)."""
    import pyarrow as pa

    if hasattr(col, "type"):  # pyarrow
        nulls = col.null_count
        if not nulls and (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            return arr.cast(pa.large_string())
        col = col.to_pandas()
    nulls = int(col.isna().sum())
    if nulls:
        raise InputError(f"{what} hold{'s' if what == 'assignment' else ''} {nulls} row(s) "
                         "without a key")
    values = col.to_numpy(dtype=object)
    try:
        return pa.array(values, type=pa.large_string())
    except (pa.ArrowException, TypeError, ValueError):  # numbers, ...: their str()
        return pa.array(col.astype(str).to_numpy(dtype=object), type=pa.large_string())


def _window_ns(col) -> np.ndarray:
    """``window_start`` as int64 nanoseconds since the epoch, UTC (naive times are UTC)."""
    import pyarrow as pa

    if hasattr(col, "type") and pa.types.is_timestamp(col.type):
        if col.null_count:
            raise InputError(f"histograms hold {col.null_count} row(s) without a window_start")
        try:
            ns = col.cast(pa.timestamp("ns", tz=col.type.tz))
        except pa.ArrowException as exc:
            raise InputError(f"histograms column 'window_start' is out of range: "
                             f"{first_line(exc)}") from None
        return _numpy(ns.cast(pa.int64()), np.int64)
    import pandas as pd

    series = col.to_pandas() if hasattr(col, "type") else col
    if not pd.api.types.is_datetime64_any_dtype(series.dtype):
        # Parse each distinct value once (a CSV repeats a few windows over many rows).
        codes, uniques = pd.factorize(series)
        parsed = np.append(_parse_times(pd.Series(uniques, dtype=object), mixed=True),
                           np.iinfo(np.int64).min)  # code -1 (missing) -> the last: NaT
        values = parsed[codes]
    else:
        values = _parse_times(series)
    missing = int((values == np.iinfo(np.int64).min).sum())
    if missing:
        raise InputError(f"histograms hold {missing} row(s) without a window_start")
    return values


def _parse_times(series, mixed: bool = False) -> np.ndarray:
    """int64 ns (NaT = int64 min) of a pandas series of times, strings or numbers.
    ``mixed``: each value parsed on its own (the distinct values of a text column, which
    may mix ISO formats and offsets), instead of one format inferred from the first."""
    import pandas as pd

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # format-inference warnings: the error says it
            strings = mixed and series.map(lambda v: isinstance(v, str)).all()
            ws = pd.to_datetime(series, utc=True, format="mixed" if strings else None)
            out = ws.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    except (ValueError, TypeError, OverflowError) as exc:
        raise InputError(f"histograms column 'window_start' is not a timestamp: "
                         f"{first_line(exc)}") from None
    return out.view(np.int64)


def _numpy(arr, dtype) -> np.ndarray:
    """A pyarrow int64 or float64 array (chunked or not, no nulls) as numpy, read from its
    buffers: pyarrow's own conversions import pandas, a large share of the time budget of
    a plan at 10^6 keys (``docs/planning.md``, "Scale")."""
    dtype = np.dtype(dtype)
    chunks = arr.chunks if hasattr(arr, "chunks") else [arr]
    parts = [np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c),
                           offset=c.offset * dtype.itemsize) if len(c) else
             np.zeros(0, dtype=dtype) for c in chunks]
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _float_values(col) -> np.ndarray:
    """A numeric column as float64 (null and non-numeric values become NaN)."""
    import pyarrow as pa

    if hasattr(col, "type"):
        t = col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
            arr = col.cast(pa.float64(), safe=False)
            if arr.null_count:
                arr = arr.fill_null(float("nan"))
            return _numpy(arr, np.float64)
        col = col.to_pandas()
    import pandas as pd

    if pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype):
        return col.to_numpy(dtype=np.float64, na_value=np.nan)
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _numeric(frame, name: str, what: str, keys=None, windows=None) -> np.ndarray:
    """A checked numeric column: every value finite and >= 0, the total <= MAX_TOTAL."""
    col = frame[name] if not _is_arrow(frame) else frame.column(name)
    values = _float_values(col)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        where = f"key {keys[i].as_py()!r}" if keys is not None else f"row {i}"
        if windows is not None:
            where += f" in window {_iso(int(windows[i]), sep=' ')}"
        raise InputError(f"{what} column {name!r} must be finite and >= 0: {where} has "
                         f"{_raw(col, i)!r} ({int(bad.sum())} bad value(s))")
    with np.errstate(over="ignore"):
        total = float(values.sum())
    if not total <= MAX_TOTAL:
        raise InputError(f"{what} column {name!r} sums to {total:.6g}, above the largest "
                         f"supported total 2^53 = {MAX_TOTAL:.6g} (float64 sums are exact up "
                         "to it; beyond it loads and migration bytes overflow or lose meaning)")
    return values


@dataclass
class HistogramRows:
    """Checked histogram rows, column by column (several rows per (window, key) kept).

    ``window``: int64 ns since the epoch (UTC); ``key``: pyarrow large_string array;
    ``count``, ``cost``, ``state_bytes``: float64 arrays.
    """

    window: np.ndarray
    key: Any
    count: np.ndarray
    cost: np.ndarray
    state_bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.window)


def check_histograms(frame) -> HistogramRows:
    """Checked rows of a pandas frame or pyarrow table (one line per problem, the first)."""
    names = _names(frame)
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise InputError(missing_message("histograms", missing, names))
    if _n_rows(frame) == 0:
        raise InputError("histograms are empty: no windows to plan over")
    get = frame.column if _is_arrow(frame) else frame.__getitem__
    keys = _key_array(get("key"), "histograms")
    window = _window_ns(get("window_start"))
    count = _numeric(frame, "count", "histograms", keys, window)
    cost = _numeric(frame, "cost", "histograms", keys, window) if "cost" in names else count
    state = (_numeric(frame, "state_bytes", "histograms", keys, window)
             if "state_bytes" in names else count)
    return HistogramRows(window, keys, count, cost, state)


def validate_histograms(frame):
    """Checked, typed rows ``window_start, key, count, cost, state_bytes`` (duplicates kept),
    as a pandas frame (``window_start`` naive UTC)."""
    import pandas as pd

    rows = check_histograms(frame)
    return pd.DataFrame({"window_start": rows.window.view("datetime64[ns]"),
                         "key": python_strings(rows.key),
                         "count": rows.count, "cost": rows.cost, "state_bytes": rows.state_bytes})


def check_assignment(frame, n_instances: int):
    """Checked assignment columns: (keys as a pyarrow string array, int64 instances in [0, N)).
    Keys listed twice are refused when they are matched (:func:`build_problem`)."""
    names = _names(frame)
    missing = [c for c in ("key", "instance") if c not in names]
    if missing:
        raise InputError(missing_message("assignment", missing, names))
    get = frame.column if _is_arrow(frame) else frame.__getitem__
    keys = _key_array(get("key"), "assignment")
    col = get("instance")
    if hasattr(col, "type") and str(col.type) == "int64" and not col.null_count:
        inst = _numpy(col, np.int64)  # the usual file: no float round trip
        bad = (inst < 0) | (inst >= n_instances)
        if not bad.any():
            return keys, inst
    inst = _float_values(col)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(inst) | (inst != np.round(inst)) | (inst < 0) | (inst >= n_instances)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"assignment instance of key {keys[i].as_py()!r} is {_raw(col, i)!r}, "
                         f"outside the integers [0, {n_instances}) ({int(bad.sum())} bad row(s))")
    return keys, inst.astype(np.int64)


def validate_assignment(frame, n_instances: int):
    """Checked ``key`` (str) -> ``instance`` (int64 in [0, N)) rows, keys unique (pandas)."""
    import pandas as pd

    keys, inst = check_assignment(frame, n_instances)
    distinct, (positions,) = sorted_keys(keys)
    refuse_duplicates(positions, distinct)
    return pd.DataFrame({"key": python_strings(keys), "instance": inst})


# ------------------------------------------------------------------ aggregating
def check_instances(n_instances) -> int:
    """N as an int, refused outside [1, MAX_INSTANCES]."""
    if isinstance(n_instances, bool) or int(n_instances) != n_instances or n_instances < 1:
        raise InputError(f"number of instances must be an integer >= 1, got {n_instances!r}")
    if n_instances > MAX_INSTANCES:
        raise InputError(f"number of instances must be <= {MAX_INSTANCES} (the key groups of "
                         f"the default placement), got {n_instances!r}")
    return int(n_instances)


@dataclass
class _Aggregate:
    """Histogram rows matched to sorted keys and windows (the core of every view)."""

    keys: Any                 # pyarrow large_string array, sorted, distinct
    windows: np.ndarray       # int64 ns, sorted, distinct (every window of the input)
    row_key: np.ndarray       # int64 position of each row's key in ``keys``
    row_window: np.ndarray    # int64 position of each row's window in ``windows``
    rows: HistogramRows
    assigned: np.ndarray | None   # positions of the assignment's keys in ``keys``


def _aggregate(frame, assignment_keys=None) -> _Aggregate:
    rows = frame if isinstance(frame, HistogramRows) else check_histograms(frame)
    arrays = [rows.key] if assignment_keys is None else [rows.key, assignment_keys]
    keys, positions = sorted_keys(*arrays)
    windows = (rows.window[:1] if (rows.window == rows.window[0]).all()
               else np.unique(rows.window))
    row_window = (np.zeros(len(rows), dtype=np.int64) if len(windows) == 1
                  else np.searchsorted(windows, rows.window))
    assigned = positions[1] if assignment_keys is not None else None
    if assigned is not None:
        refuse_duplicates(assigned, keys)
    return _Aggregate(keys, windows, positions[0], row_window, rows, assigned)


def _latest_state(n_keys: int, key: np.ndarray, window: np.ndarray,
                  state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key: its latest window among the rows (-1: none) and its largest state there."""
    if len(key) == n_keys and not window.any():
        # one window, one row per key (every key of the input): a plain scatter
        latest = np.full(n_keys, -1, dtype=np.int64)
        latest[key] = 0
        if (latest == 0).all():
            out = np.empty(n_keys)
            out[key] = state
            return latest, out
    latest = np.full(n_keys, -1, dtype=np.int64)
    np.maximum.at(latest, key, window)
    out = np.zeros(n_keys)
    last = window == latest[key]
    np.maximum.at(out, key[last], state[last])
    return latest, out


def build_problem(frame, n_instances: int, assignment=None,
                  windows: int = 1) -> tuple[Problem, dict[str, Any]]:
    """The planning problem of histogram rows, and a JSON-ready summary of the input.

    ``frame`` and ``assignment`` are pandas frames or pyarrow tables (``assignment``:
    columns ``key``, ``instance``; None: every key on its default placement).
    """
    problem, summary, _ = _build(frame, n_instances, assignment, windows)
    return problem, summary


def _build(frame, n_instances: int, assignment, windows: int):
    """:func:`build_problem`, plus the problem's keys as a pyarrow string array.

    ``frame`` may be a list [histograms, assignment] instead: the list is emptied, so
    the input tables are freed as soon as their columns are checked."""
    n_instances = check_instances(n_instances)
    if isinstance(windows, bool) or int(windows) != windows or windows < 1:
        raise InputError(f"windows must be an integer >= 1, got {windows!r}")
    if isinstance(frame, list):
        frame, assignment = frame.pop(0), frame.pop(0)
    rows = check_histograms(frame)
    assign = None if assignment is None else check_assignment(assignment, n_instances)
    del frame, assignment
    agg = _aggregate(rows, None if assign is None else assign[0])

    k = len(agg.keys)
    w = min(int(windows), len(agg.windows))
    first = len(agg.windows) - w
    sel = agg.row_window >= first
    if sel.all():
        ki, wi, cost, count, state_rows = (agg.row_key, agg.row_window - first, rows.cost,
                                           rows.count, rows.state_bytes)
    else:
        ki, wi = agg.row_key[sel], agg.row_window[sel] - first
        cost, count, state_rows = rows.cost[sel], rows.count[sel], rows.state_bytes[sel]
    # (window, key) duplicates: costs add up in the bincount, the state takes the max
    if w * k <= MAX_SERIES_CELLS:
        series = np.bincount(wi * k + ki, weights=cost, minlength=w * k).reshape(w, k)
        load = series.sum(axis=0) / w
    else:  # no dense windows x keys matrix: the mean per window straight from the rows
        series = None
        load = np.bincount(ki, weights=cost, minlength=k) / w
    latest, state = _latest_state(k, ki, wi, state_rows)

    groups = key_groups(agg.keys)
    default = group_instances(n_instances)[groups]
    current = default.copy()
    n_listed = 0
    if assign is not None and len(agg.assigned):
        current[agg.assigned] = assign[1]
        n_listed = len(agg.assigned)
    problem = Problem(keys=python_strings(agg.keys), load=load,
                      state=state, current=current, default=default, n_instances=n_instances,
                      load_series=series, key_group=groups)
    histogram_keys = np.zeros(k, dtype=bool)
    histogram_keys[agg.row_key] = True
    summary = {
        "rows": int(len(rows)),
        "keys": int(k),
        "histogram_keys": int(histogram_keys.sum()),
        "planned_window_keys": int((latest >= 0).sum()),
        "assignment_keys": int(n_listed),
        "keys_off_default": int((current != default).sum()),
        "windows_available": int(len(agg.windows)),
        "windows_requested": int(windows),
        "windows_used": int(w),
        "windows": [_iso(int(t)) for t in agg.windows[first:]],
        "total_events": float(count.sum()),
        "total_load": float(problem.load.sum()),
        "total_state_bytes": float(state.sum()),
        "load": "mean cost per window over the planned windows",
        "state": "state_bytes of the latest planned window the key appears in",
    }
    if series is None:
        summary["load_series"] = (f"omitted: {w} windows x {k} keys = {w * k} cells, above "
                                  f"{MAX_SERIES_CELLS} (CLB falls back to ELB)")
    return problem, summary, agg.keys


def problem_from_histograms(frame, n_instances: int, assignment=None,
                            windows: int = 1) -> Problem:
    """The planning problem of histogram rows (see the module docstring for the choices)."""
    return build_problem(frame, n_instances, assignment, windows)[0]


def window_matrices(frame, n_instances: int) -> dict[str, Any]:
    """Every window of histogram rows at once, for a replay (``rebalance bench``).

    Returns ``keys`` (sorted, object array), ``windows`` (int64 ns), ``load`` and
    ``state`` (windows x keys: each window's merged cost and state, 0 where a key is
    absent), and ``default`` (the default instance of each key): window t alone gives
    the same load and state as :func:`build_problem` of that window's rows.
    """
    n_instances = check_instances(n_instances)
    agg = _aggregate(frame)
    k, w = len(agg.keys), len(agg.windows)
    if w * k > MAX_SERIES_CELLS:
        raise InputError(f"histograms hold {w} windows x {k} keys = {w * k} cells: a replay "
                         f"keeps two dense windows x keys matrices ({16 * w * k / 2 ** 30:.1f} "
                         f"GiB), above the limit of {MAX_SERIES_CELLS} cells "
                         f"({16 * MAX_SERIES_CELLS / 2 ** 30:.0f} GiB): replay fewer windows "
                         "or keys")
    flat = agg.row_window * k + agg.row_key
    load = np.bincount(flat, weights=agg.rows.cost, minlength=w * k).reshape(w, k)
    state = np.zeros(w * k)
    np.maximum.at(state, flat, agg.rows.state_bytes)
    groups = key_groups(agg.keys)
    return {"keys": python_strings(agg.keys), "windows": agg.windows,
            "load": load, "state": state.reshape(w, k),
            "default": group_instances(n_instances)[groups], "key_group": groups}


def load_input(histograms: str | Path, n_instances: int, assignment_path: str | Path | None = None,
               windows: int = 1) -> tuple[Problem, dict[str, Any]]:
    """Read and aggregate the files of ``rebalance plan``."""
    problem, summary, _ = read_input(histograms, n_instances, assignment_path, windows)
    return problem, summary


def read_input(histograms: str | Path, n_instances: int, assignment_path: str | Path | None = None,
               windows: int = 1):
    """:func:`load_input`, plus the problem's keys as a pyarrow string array (what
    ``rebalance plan`` writes back, without converting 10^6 Python strings again)."""
    n_instances = check_instances(n_instances)
    # _build drops the tables once their columns are checked (10^7 rows: 0.5 GB).
    tables = [read_histogram_table(histograms),
              None if assignment_path is None else read_assignment_table(assignment_path)]
    problem, summary, keys = _build(tables, n_instances, None, windows)
    path = Path(histograms)
    summary["histograms_format"] = ("delta" if is_delta(path) else
                                    "csv" if path.suffix.lower() == ".csv" else "parquet")
    return problem, summary, keys


def _iso(ns: int, sep: str = "T") -> str:
    """ISO 8601 of a UTC time in ns (``2024-01-01T00:00:00+00:00``; ns digits when needed)."""
    import datetime as dt

    seconds, rest = divmod(ns, 10 ** 9)
    t = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=seconds,
                                                                       microseconds=rest // 1000)
    text = t.isoformat(sep=sep)
    if rest % 1000:
        head, _, tz = text.rpartition("+")
        frac = f"{rest:09d}"
        text = f"{head.split('.')[0]}.{frac}+{tz}"
    return text
