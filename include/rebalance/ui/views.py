"""What the Rebalance view shows, as plain data: read-only, one function a page.

The Airflow plugin (``plugins/rebalance_view.py``) renders these dicts as HTML and
serves them as JSON under ``/rebalance/api``; scripts can call them directly. Each
function takes a Spark session (in the service: the Spark Connect client of the
control plane) and reads the Delta tables through :mod:`rebalance.spark.tables` and
:class:`~rebalance.spark.plan_store.PlanStore`; nothing here writes.

Each result is a function of the tables it reads, so it is kept (the newest
:data:`CACHE_SIZE`) under the log version of each of those tables: while none of them
gains a commit, a page or a JSON call is answered from memory without a Spark job. Tables
that cannot be listed (a URI, a table not created yet) are read every time.

>>> plans(spark)[0]["status"]                     # doctest: +SKIP
'verified'
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import threading
from collections import OrderedDict
from typing import Any

from rebalance.core.records import PlanRecord, as_utc, frame_loads, frame_splits
from rebalance.spark import tables
from rebalance.spark.delta_rs import log_ident
from rebalance.spark.loads import window_loads
from rebalance.spark.paths import join
from rebalance.spark.plan_store import PLAN_ASSIGNMENTS, PLANS, PlanStore

#: Results kept, the least recently used dropped first.
CACHE_SIZE = 64
_CACHE: OrderedDict = OrderedDict()
_LOCK = threading.Lock()


def by_tables(*names: str, copy_result: bool = True):
    """Keep a view function's results under the log versions of the tables ``names``
    (:func:`~rebalance.spark.delta_rs.log_ident`) and its arguments; a caller gets a copy
    (``copy_result`` False: the kept result itself, for callers that only read it)."""
    share = (lambda value: value) if not copy_result else copy.deepcopy

    def wrap(fn):
        @functools.wraps(fn)
        def call(spark, *args, **kwargs):
            root = tables.tables_root()
            idents = tuple(log_ident(join(root, name)) for name in names)
            if None in idents:
                return fn(spark, *args, **kwargs)
            key = (fn.__name__, args, tuple(sorted(kwargs.items())), str(root), idents)
            with _LOCK:
                if key in _CACHE:
                    _CACHE.move_to_end(key)
                    return share(_CACHE[key])
            result = fn(spark, *args, **kwargs)   # read at these versions or newer ones
            with _LOCK:
                _CACHE[key] = share(result)
                while len(_CACHE) > CACHE_SIZE:
                    _CACHE.popitem(last=False)
            return result
        return call
    return wrap

@by_tables("plans", copy_result=False)
def _plan_records(spark) -> tuple:
    """Every plan record, read once per version of ``plans`` (the index page asks twice:
    the plan history and the theta of each version shown). A tuple shared by its callers,
    not copied: the view functions only read the records. Empty without a ``plans`` table."""
    return tuple(PlanStore(spark).plans()) if tables.exists(spark, PLANS) else ()


#: Columns of the plan history, in display order.
PLAN_COLUMNS = (
    "plan_id", "status", "method", "run_type", "created_at", "imbalance_before",
    "predicted_imbalance", "backtested_imbalance", "staying_imbalance", "realised_imbalance",
    "theta", "attainable_theta", "theta_plan", "load_model", "migration_fraction", "migration_bytes",
    "moved_keys", "table_size", "lower_bound_migration_fraction", "base_assignment_version",
    "assignment_version", "dag_id", "run_id")


class NotFound(LookupError):
    """No plan with that id."""


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, (dt.datetime, dt.date)) else value


def plan_row(record: PlanRecord) -> dict[str, Any]:
    """One line of the plan history."""
    m = record.metrics
    bt = record.backtest
    return {
        "plan_id": record.plan_id, "status": record.status, "method": record.method,
        "run_type": record.run_type, "dag_id": record.dag_id, "run_id": record.run_id,
        "apply_mode": record.apply_mode,
        "created_at": _iso(record.created_at), "updated_at": _iso(record.updated_at),
        "data_interval_start": _iso(record.data_interval_start),
        "data_interval_end": _iso(record.data_interval_end),
        "imbalance_before": m.get("imbalance_before"),
        "predicted_imbalance": record.predicted_imbalance,
        "backtested_imbalance": bt.get("planned"),
        "staying_imbalance": bt.get("staying"),
        "realised_imbalance": record.realised_imbalance,
        "theta": record.params.get("theta"),
        "attainable_theta": bt.get("attainable_theta"),
        "theta_plan": bt.get("theta_plan"),
        "load_model": bt.get("load_model"),
        "backtest": bt,
        "migration_fraction": m.get("migration_fraction"),
        "migration_bytes": m.get("migration_bytes"),
        "moved_keys": m.get("moved_keys"), "table_size": m.get("table_size"),
        "lower_bound_migration_fraction": m.get("lower_bound_migration_fraction"),
        "lower_bound_migration_bytes": m.get("lower_bound_migration_bytes"),
        "base_assignment_version": record.base_assignment_version,
        "assignment_version": record.assignment_version,
        "reasons": list(record.reasons),
    }


@by_tables("plans")
def plans(spark, limit: int = 200) -> list[dict[str, Any]]:
    """The plan history, newest first."""
    records = sorted(_plan_records(spark),
                     key=lambda r: r.created_at or dt.datetime.min.replace(tzinfo=dt.timezone.utc),
                     reverse=True)
    return [plan_row(r) for r in records[:limit]]


@by_tables("plans", "plan_assignments", "assignments")
def plan(spark, plan_id: str) -> dict[str, Any]:
    """One plan: its history line, instance loads before and after, the moved keys with
    their state, the validation result (every expectation), the verification, and the
    Delta commits behind it (plans, plan_assignments, assignments)."""
    store = PlanStore(spark)
    record = store.get(plan_id)
    if record is None:
        raise NotFound(f"no plan {plan_id!r}")
    frame = store.frame(plan_id)
    n = int(record.inputs.get("n_instances") or (frame[["instance", "current"]].max().max() + 1))
    before, after = frame_loads(frame, n, "current"), frame_loads(frame, n)
    moved = frame[frame["moved"]].sort_values("state", ascending=False)
    splits = frame_splits(frame)
    return {
        **plan_row(record),
        "params": record.params,
        "inputs": {k: v for k, v in record.inputs.items() if k != "windows"},
        "windows": record.inputs.get("windows", []),
        "metrics": record.metrics,
        "instance_loads": {"instance": list(range(n)), "before": [float(x) for x in before],
                           "after": [float(x) for x in after]},
        "moved": [{"key": str(r.key), "from": int(r.current), "to": int(r.instance),
                   "load": float(r.load), "state_bytes": float(r.state)}
                  for r in moved.itertuples()],
        "split": [{"key": key, "instances": list(parts), "shares": list(parts.values())}
                  for key, parts in splits.items()],
        "validation": record.validation,
        "verification": {k: _iso(v) for k, v in record.verification.items()},
        "commits": commits(spark, plan_id, since=record.created_at),
    }


#: How long before a plan's ``created_at`` its commits are looked for (clocks of the
#: Airflow workers and of the storage may differ this much).
COMMITS_SLACK = dt.timedelta(hours=1)


def commits(spark, plan_id: str, since: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The Delta commits that name the plan, oldest first, across its tables. With
    ``since`` (the plan's creation time), each table's history is read newest first down
    to then (less :data:`COMMITS_SLACK`), not whole: the page reads the commits made since
    the plan, however old the tables are."""
    floor = as_utc(since) - COMMITS_SLACK if since is not None else None
    out = []
    for table in (PLANS, PLAN_ASSIGNMENTS, tables.ASSIGNMENTS):
        if not tables.exists(spark, table):
            continue
        for c in tables.commits(spark, table):
            if floor is not None and c.timestamp is not None and as_utc(c.timestamp) < floor:
                break
            if c.metadata.get("plan_id") == plan_id:
                out.append({"table": table.name, "version": int(c.version),
                            "timestamp": _iso(c.timestamp), "operation": c.operation,
                            "action": c.metadata.get("action"), "userMetadata": c.metadata})
    return sorted(out, key=lambda c: (c["timestamp"] or "", c["table"], c["version"]))


@by_tables("assignments")
def assignments(spark, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` published assignment versions, newest first; the live one
    (the newest) is marked. (``rebalance history --limit 0`` lists them all.)"""
    if not tables.exists(spark, tables.ASSIGNMENTS):
        return []
    history = tables.assignment_history(spark, limit=limit)
    live = max((int(c.version) for c in history), default=None)
    return [{"version": int(c.version), "timestamp": _iso(c.timestamp), "live": int(c.version) == live,
             "action": c.metadata.get("action"), "plan_id": c.metadata.get("plan_id"),
             "run_id": c.metadata.get("run_id"), "method": c.metadata.get("method"),
             "apply_mode": c.metadata.get("apply_mode"),
             "routing_keys": c.metadata.get("routing_keys", c.metadata.get("table_size")),
             "n_instances": c.metadata.get("n_instances")}
            for c in history]


#: Windows the index page's two charts show (the same for both: one time range).
CHART_WINDOWS = 60


@by_tables("assignments", "instance_histograms")
def instance_loads(spark, windows: int = CHART_WINDOWS) -> dict[str, Any]:
    """Instance loads over the latest ``windows`` windows (for the chart: every instance
    of the job, one that received nothing at 0), with the imbalance of each window over
    the N instances and the assignment version it ran under
    (:func:`rebalance.spark.loads.window_loads`, as ``verify`` and ``rebalance status``)."""
    n = (tables.assignments_n_instances(spark) if tables.exists(spark, tables.ASSIGNMENTS)
         else None)
    w = window_loads(spark, n, latest=windows)
    return {
        "windows": [_iso(as_utc(x)) for x in w.windows],
        "instances": list(range(w.loads.shape[1])) if w.windows else [],
        "loads": [[float(x) for x in row] for row in w.loads],
        "imbalance": w.imbalances(),
        "versions": w.versions,
    }


@by_tables("assignments", "instance_histograms", "key_histograms", "plans")
def realised_ratios(spark, windows: int = CHART_WINDOWS) -> dict[str, Any]:
    """The realised max / mean load ratios of the latest ``windows`` windows, read from the
    tables with the bound ``1 + theta`` of each (the computation is
    :meth:`rebalance.spark.loads.WindowLoads.imbalances`).

    Per window (oldest first): the imbalance (max / mean instance load over the job's N
    instances, an instance without rows counting 0) from ``instance_histograms`` (the
    job's per-instance loads; ``key_histograms`` summed per instance where the job wrote
    no instance rows), the assignment version it ran under, and the ``theta`` of the plan
    that made that version live (``default_theta`` for versions no plan made: the first
    one, and versions restored after a failed restart). ``checks``: every plan's verify
    result (realised imbalance, its first verified window, status).
    """
    from rebalance.control.params import RunParams

    default_theta = RunParams().theta
    empty = {"windows": [], "imbalance": [], "versions": [], "theta": [],
             "default_theta": default_theta, "checks": []}
    if not tables.exists(spark, tables.ASSIGNMENTS):
        return empty
    w = window_loads(spark, tables.assignments_n_instances(spark), latest=windows)
    if not w.windows:
        return empty
    records = {r.plan_id: r for r in _plan_records(spark)}
    theta_of = {int(c.version): float(records[c.metadata["plan_id"]].params["theta"])
                # only the versions the windows shown ran under
                for c in tables.assignment_history(spark, after=min(w.versions) - 1)
                if c.metadata.get("action") != "rollback"
                and c.metadata.get("plan_id") in records
                and "theta" in records[c.metadata["plan_id"]].params}
    checks = [{"plan_id": r.plan_id, "status": r.status, "realised": r.realised_imbalance,
               "window": (r.verification.get("windows") or [None])[0],
               "theta": r.params.get("theta"), "limit": r.verification.get("limit")}
              for r in records.values() if r.realised_imbalance is not None]
    return {
        "windows": [_iso(as_utc(x)) for x in w.windows],
        "imbalance": w.imbalances(),
        "versions": w.versions,
        "theta": [theta_of.get(v, default_theta) for v in w.versions],
        "default_theta": default_theta,
        "checks": sorted(checks, key=lambda c: c["window"] or ""),
    }
