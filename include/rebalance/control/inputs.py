"""The run's input snapshot in Delta: which histogram windows, which versions, what problem.

:func:`read_windows` pins the windows of the run's data interval, the ``key_histograms``
and base assignment versions; :func:`load_rows` reads the pinned histogram rows once;
:func:`load_problem` turns them into the planning problem through
:func:`rebalance.core.histograms.build_problem`, the same aggregation as ``rebalance plan``,
and :func:`window_history` into the per-window loads the trigger and the backtest read.
Spark is imported inside the functions only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rebalance.control.errors import RunSkipped
from rebalance.control.params import RunInfo, RunParams
from rebalance.core import registry
from rebalance.core.backtest import WindowHistory
from rebalance.core.model import PlanningError, Problem
from rebalance.core.records import FRAME_COLUMNS, SPLIT_COLUMN, as_utc, moved_mask, split_text
from rebalance.spark.session import SNAPSHOT_PARTITIONS

if TYPE_CHECKING:
    from rebalance.spark.plan_store import PlanStore

log = logging.getLogger(__name__)


#: Runtime settings for the control plane's small Delta tables, applied when the session
#: has none (a local session has them already; a cluster's does not): Delta replays a
#: table's log into 50 partitions by default, which dominates every read and write of a
#: table of a few KB (measured: 41 s -> 11 s per plan cycle).
CONTROL_PLANE_CONF = {"spark.databricks.delta.snapshotPartitions": str(SNAPSHOT_PARTITIONS)}


def spark_session():
    """The project session (:func:`rebalance.spark.session.get_spark`), tuned for small
    tables, started on first use: a task that only reads local tables (through delta-rs,
    :mod:`rebalance.spark.delta_rs`) never connects to Spark."""
    return _LazySession()


def _start_session():
    from rebalance.spark.session import get_spark

    spark = get_spark("rebalance-dag", conf=CONTROL_PLANE_CONF)
    for key, value in CONTROL_PLANE_CONF.items():
        if spark.conf.get(key, None) is None:
            spark.conf.set(key, value)
    return spark


class _LazySession:
    """A Spark session that starts (or connects) when something of it is first used."""

    def __init__(self) -> None:
        self._session = None

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._session is None:
            self._session = _start_session()
        return getattr(self._session, name)


def plan_store(spark=None) -> PlanStore:
    """The control plane's :class:`~rebalance.spark.plan_store.PlanStore` (on
    :func:`spark_session` unless a session is given)."""
    from rebalance.spark.plan_store import PlanStore

    return PlanStore(spark_session() if spark is None else spark)


def read_windows(params: Mapping[str, Any], dag_id: str, run_id: str, run_type: Any,
                 data_interval_start: Any, data_interval_end: Any) -> dict[str, Any]:
    """Pick the histogram windows of the run's data interval and pin the input snapshot,
    waiting here up to :func:`windows_wait_seconds` for them (the DAG waits on the
    triggerer instead: :func:`windows_check`).

    Returns ``{"run", "params", "inputs"}``; ``inputs`` names the windows, their event
    count, the ``key_histograms`` Delta version read, the base assignment version and
    the number of instances. A run that already stored a plan gets that plan's inputs
    back (so its plan id does not change). Raises :class:`RunSkipped` when there are
    too few valid windows or events.
    """
    args = windows_args(params, dag_id, run_id, run_type, data_interval_start,
                        data_interval_end)
    while True:
        result = windows_check(args)
        if result["is_done"]:
            return result["xcom_value"]
        time.sleep(wait_poll_seconds())


def windows_args(params: Mapping[str, Any], dag_id: str, run_id: str, run_type: Any,
                 data_interval_start: Any, data_interval_end: Any) -> dict[str, Any]:
    """What :func:`windows_check` needs, JSON-able (a trigger carries it): the run, its
    params and the wall-clock deadline (epoch seconds) of its wait, from now."""
    run = RunInfo.of(dag_id, run_id, run_type, data_interval_start, data_interval_end)
    wait = windows_wait_seconds()
    # the interval's windows are written after it ends: a run triggered before its
    # interval's end waits from then
    since = max(time.time(), run.end.timestamp() if run.end is not None else 0.0)
    return {"params": dict(params), "run": run.to_dict(), "deadline": since + wait,
            "wait": wait}


def windows_check(args: Mapping[str, Any]) -> dict[str, Any]:
    """One look for the run's windows (:func:`windows_args`): ``{"is_done": True,
    "xcom_value": {"run", "params", "inputs"}}``, or ``is_done`` False while there are too
    few and the deadline has not passed (the job creates its tables at start and writes a
    window once its watermark passed it: a starting or lagging job gets the time the
    service allows, ``REBALANCE_WINDOWS_WAIT_SECONDS``). Backfills never wait. Raises
    :class:`RunSkipped` when there are too few valid windows or events by then."""
    p = RunParams.parse(args["params"])
    run = RunInfo(**args["run"])
    spark = spark_session()
    deadline = _wait_until(spark, args) if not run.is_backfill else 0.0
    # while waiting, nothing changes the answer before a commit or the deadline (waits.py)
    waiting = {"is_done": False, "xcom_value": None, "recheck_at": deadline}
    may_wait = time.time() < deadline
    stored = plan_store(spark).find_for_run(run.dag_id, run.run_id)
    if stored is not None:
        log.info("run %s already stored plan %s: reusing its inputs", run.run_id, stored.plan_id)
        return {"is_done": True,
                "xcom_value": {"run": run.to_dict(), "params": p.to_dict(),
                               "inputs": stored.inputs}}

    from rebalance.spark import tables

    try:
        if not tables.exists(spark, tables.ASSIGNMENTS):
            raise RunSkipped("no assignments table yet (the streaming job creates it at "
                             "start): nothing to rebalance")
        version, windows = _interval_windows(spark, run, p.lookback_windows)
    except RunSkipped:
        if may_wait:
            return waiting
        raise
    valid = [w for w in windows if w["events"] > 0]
    if len(valid) < p.min_windows and may_wait and not _passed(spark, run, version):
        return waiting
    live_version = tables.latest_assignment_version(spark)
    n_instances = tables.assignments_n_instances(spark)
    where = _windows_text(run, p.lookback_windows)
    if len(valid) < p.min_windows:
        raise RunSkipped(f"too few valid windows: {len(valid)} with events in {where}, "
                         f"{p.min_windows} required")
    events = int(sum(w["events"] for w in valid))
    if events < p.min_events:
        raise RunSkipped(f"too few events: {events} in {len(valid)} windows of {where}, "
                         f"{p.min_events} required (param min_events)")
    # A backfill replans the past: against the assignment that was live in its windows.
    base = max(w["assignment_version"] for w in valid) if run.is_backfill else live_version
    inputs = {
        "windows": [w["window_start"] for w in valid],
        "events": events,
        "key_histograms_version": version,
        "base_assignment_version": int(base),
        "n_instances": n_instances,
    }
    log.info("windows %s: %d windows, %d events, key_histograms v%d, assignment v%d",
             where, len(valid), events, version, base)
    return {"is_done": True,
            "xcom_value": {"run": run.to_dict(), "params": p.to_dict(), "inputs": inputs}}


#: How often the DAG's waits (``windows``, ``await_restart``, ``verify``) look again, by
#: default: a few times per 20-s window.
WAIT_POLL_SECONDS = 5.0


def env_seconds(name: str, default: float, valid, what: str) -> float:
    """A number of seconds from the environment variable ``name`` (``default`` when unset
    or empty); ``ValueError`` naming the variable, ``what`` it must be and the value given
    when it is no number or ``valid(value)`` is false."""
    import os

    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = float("nan")
    if not valid(value):  # NaN fails every comparison
        raise ValueError(f"{name} must be {what}, got {raw!r}")
    return value


def wait_poll_seconds() -> float:
    """How often the DAG's waits look again (``REBALANCE_WAIT_POLL_SECONDS``, default
    :data:`WAIT_POLL_SECONDS`). The service sets a quarter of its window length, so a
    verification on windows of a few seconds is not left waiting a whole poll."""
    return env_seconds("REBALANCE_WAIT_POLL_SECONDS", WAIT_POLL_SECONDS,
                       lambda v: 0 < v <= 600, "a number of seconds in (0, 600]")


def retry_delay_seconds() -> float:
    """How long Airflow waits before a failed task of the DAG runs again
    (``REBALANCE_RETRY_DELAY_SECONDS``, default 30)."""
    return env_seconds("REBALANCE_RETRY_DELAY_SECONDS", 30.0, lambda v: 0 <= v <= 3600,
                       "a number of seconds in [0, 3600]")


def job_name() -> str:
    """Name of the streaming job the DAG controls: the current job's
    (``registry.job_scope``), else ``REBALANCE_JOB_NAME``, else ``keyed``."""
    job = registry.current_job()
    return job.name if job is not None else os.environ.get("REBALANCE_JOB_NAME", "keyed")


def windows_wait_seconds() -> float:
    """How long ``windows`` waits for ``min_windows`` windows of the interval to be written
    before it skips the run (``REBALANCE_WINDOWS_WAIT_SECONDS``, default 0: no wait). The
    service sets it: a scheduled run starts at the end of its interval, while the job
    writes the interval's last windows only once its watermark passed them."""
    return env_seconds("REBALANCE_WINDOWS_WAIT_SECONDS", 0.0, lambda v: 0 <= v <= 3600,
                       "a number of seconds in [0, 3600]")


def _windows_text(run: RunInfo, lookback: int) -> str:
    """Which windows the run looked at, for a person: those of ``_interval_windows``."""
    if run.end is None:  # a run without a data interval plans on the latest windows
        return f"the latest {lookback} windows stored"
    if run.start is None or run.start == run.end:
        return f"the {lookback} windows before {run.data_interval_end}"
    return f"[{run.data_interval_start}, {run.data_interval_end})"


def _interval_windows(spark, run: RunInfo, lookback: int) -> tuple[int, list[dict[str, Any]]]:
    """Latest key_histograms version and the last ``lookback`` windows starting in the interval."""
    from rebalance.spark import tables

    if not tables.exists(spark, tables.KEY_HISTOGRAMS):
        raise RunSkipped(f"no key histograms stored yet at {tables.KEY_HISTOGRAMS.path()}")
    version = int(tables.history(spark, tables.KEY_HISTOGRAMS, limit=1)[0].version)
    filters = []
    if run.end is not None:
        filters.append(("window_start", "<", run.end))
    if run.start is not None and run.start != run.end:
        filters.append(("window_start", ">=", run.start))
    pdf = tables.read_pandas(spark, tables.KEY_HISTOGRAMS, version=version, filters=filters,
                             columns=["window_start", "count", "assignment_version"])
    if pdf is None or pdf.empty:
        return version, []
    per_window = (pdf.groupby("window_start")
                  .agg(events=("count", "sum"), av=("assignment_version", "max"))
                  .sort_index().tail(lookback))
    windows = [{"window_start": as_utc(w).isoformat(), "events": _int(r.events),
                "assignment_version": _int(r.av)} for w, r in per_window.iterrows()]
    return version, windows


#: How long a job that (re)started may take to write its first window (a cold first
#: micro-batch: about 1-2 minutes under ``make up``) before a run's wait for windows counts
#: from its start.
JOB_START_SECONDS = 180.0


def _wait_until(spark, args: Mapping[str, Any]) -> float:
    """The end of the run's wait for windows (epoch seconds): its ``deadline``, or later if
    the job (re)started since it ended (its newest ``jobs`` row): the wait then counts
    from the job's first histogram commit after that start, or, before there is one,
    lasts :data:`JOB_START_SECONDS` from the start. So a run triggered while the job
    starts (the first run of ``make up``) is not skipped for the windows a cold first
    micro-batch has not written yet. No wait (``REBALANCE_WINDOWS_WAIT_SECONDS`` 0) stays
    none."""
    from rebalance.spark import tables
    from rebalance.spark.jobs import latest_start

    deadline = float(args["deadline"])
    wait = float(args.get("wait", 0.0))
    start = latest_start(spark, job_name()) if wait > 0 else None
    if start is None or start.started_at is None:
        return deadline
    began = start.started_at.timestamp()
    if time.time() - began > JOB_START_SECONDS + wait:  # long started: nothing to extend
        return deadline
    if not tables.exists(spark, tables.KEY_HISTOGRAMS):
        return max(deadline, began + JOB_START_SECONDS)
    first = None
    for commit in tables.commits(spark, tables.KEY_HISTOGRAMS):   # newest first
        if as_utc(commit.timestamp).timestamp() < began:
            break
        if "batch_id" in commit.metadata:   # the job's own writes (not maintenance)
            first = commit
    if first is None:
        return max(deadline, began + JOB_START_SECONDS)
    return max(deadline, as_utc(first.timestamp).timestamp() + wait)


def _passed(spark, run: RunInfo, version: int) -> bool:
    """Whether the job stored a window that starts at or after the run's interval end (in
    ``key_histograms`` at ``version``): the job writes a window once its watermark passed
    it, in order, so every window of the interval it will ever write is written, and
    waiting longer for too few of them only holds the next run back (the first run after
    ``make up``, whose interval ended before the job started, would wait out the whole
    ``REBALANCE_WINDOWS_WAIT_SECONDS``)."""
    from rebalance.spark import tables

    if run.end is None:
        return False
    pdf = tables.read_pandas(spark, tables.KEY_HISTOGRAMS, version=version,
                             filters=[("window_start", ">=", run.end)], columns=["window_start"])
    return pdf is not None and not pdf.empty


def _int(value) -> int:
    return 0 if value is None or pd.isna(value) else int(value)


def load_rows(spark, inputs: Mapping[str, Any]) -> pd.DataFrame:
    """The histogram rows of the pinned windows (one Delta version of ``key_histograms``),
    merged per (window, key): ``window_start, key, count, cost, state_bytes``."""
    from rebalance.spark.loads import histogram_rows

    windows = list(inputs["windows"])
    pdf = histogram_rows(spark, [as_utc(w) for w in windows],
                         version=int(inputs["key_histograms_version"]))
    if pdf is None or pdf.empty:
        raise PlanningError(f"no histogram rows in windows {windows}")
    return pdf


def base_routing(spark, inputs: Mapping[str, Any]) -> dict[str, int]:
    """The routing table of the run's base assignment version (the live one)."""
    from rebalance.spark import tables

    return tables.read_assignment(spark, version=int(inputs["base_assignment_version"])).routing


#: Separates a split key's name from its share's instance in :func:`window_history`.
SHARE_SEPARATOR = "\x1f"


def split_rows(rows: pd.DataFrame, splits: Mapping[str, Mapping[int, float]]) -> pd.DataFrame:
    """Histogram rows with each split key's rows replaced by one row per share (named
    ``key<SHARE_SEPARATOR>instance``), count, cost and state scaled by the share: the
    trigger and the backtest then see the load each share puts on its instance."""
    if not splits or rows.empty:
        return rows
    split = rows["key"].astype(str).isin(list(splits))
    if not split.any():
        return rows
    parts = []
    for key, group in rows[split].groupby(rows.loc[split, "key"].astype(str)):
        for instance, share in splits[key].items():
            part = group.copy()
            part["key"] = f"{key}{SHARE_SEPARATOR}{instance}"
            for column in ("count", "cost", "state_bytes"):
                if column in part:
                    part[column] = part[column].astype("float64") * share
            parts.append(part)
    return pd.concat([rows[~split], *parts], ignore_index=True)


def window_history(rows: pd.DataFrame, n_instances: int, routing: Mapping[str, int],
                   splits: Mapping[str, Mapping[int, float]] | None = None,
                   ) -> tuple[WindowHistory, np.ndarray]:
    """The pinned windows as a :class:`~rebalance.core.backtest.WindowHistory` (per-window key
    loads, oldest first) and the live assignment of its keys (the routing table over the
    default placement): what the trigger judges and the backtest replays. A split key of
    the live assignment (``splits``) is one part per share, each on its instance
    (:func:`split_rows`)."""
    history = WindowHistory.from_histograms(split_rows(rows, splits or {}), int(n_instances))
    routing = {**routing, **{f"{k}{SHARE_SEPARATOR}{i}": i
                             for k, parts in (splits or {}).items() for i in parts}}
    current = np.array([int(routing.get(k, d)) for k, d in zip(history.keys, history.default)],
                       dtype=np.int64)
    return history, current


def base_assignment(spark, inputs: Mapping[str, Any]):
    """The run's base assignment version (the live one): routing table and split keys."""
    from rebalance.spark import tables

    return tables.read_assignment(spark, version=int(inputs["base_assignment_version"]))


def load_problem(spark, inputs: Mapping[str, Any], rows: pd.DataFrame | None = None,
                 table: Mapping[str, int] | None = None) -> tuple[Problem, dict[str, int]]:
    """The planning problem of the pinned inputs, and the base routing table.

    The histogram rows of the pinned windows (one Delta version of ``key_histograms``)
    go through the same aggregation as ``rebalance plan``
    (:func:`rebalance.core.histograms.build_problem`): load of a key = its cost per window
    (mean over the windows, absent = 0), state = the state bytes it held at the close
    of its latest window (the job's state is the sliding window of its last w windows:
    Fang et al.'s S(k, w)), current instance = the base assignment version's routing table
    over the default placement. Keys of the routing table without events are planned too.
    ``rows``, ``table``: the pinned rows and the base routing table when already read
    (:func:`load_rows`, :func:`base_assignment`).
    """
    from rebalance.core.histograms import build_problem

    pdf = load_rows(spark, inputs) if rows is None else rows
    table = dict(base_routing(spark, inputs) if table is None else table)
    routing = pd.DataFrame({"key": list(table), "instance": list(table.values())})
    problem, _ = build_problem(pdf, int(inputs["n_instances"]), routing,
                               windows=len(inputs["windows"]))
    return problem, table


def assignment_frame(problem: Problem, assignment: np.ndarray,
                     splits: Mapping[str, Mapping[int, float]] | None = None) -> pd.DataFrame:
    """The per-key frame that is stored and validated for a plan (:data:`FRAME_COLUMNS`),
    with :data:`~rebalance.core.records.SPLIT_COLUMN` when ``splits`` (key -> {instance:
    share}) spreads keys over several instances."""
    a = np.asarray(assignment)
    frame = pd.DataFrame({
        "key": problem.keys.astype(str),
        "instance": a,
        "current": problem.current,
        "default": problem.default,
        "load": problem.load,
        "state": problem.state,
        "moved": moved_mask(problem.keys, a, problem.current,
                            {str(k): parts for k, parts in (splits or {}).items()}),
    }).loc[:, list(FRAME_COLUMNS)]
    if splits:
        text = {str(k): split_text(parts) for k, parts in splits.items()}
        frame[SPLIT_COLUMN] = frame["key"].map(text).astype(object)
        frame[SPLIT_COLUMN] = frame[SPLIT_COLUMN].where(frame[SPLIT_COLUMN].notna(), None)
    return frame


