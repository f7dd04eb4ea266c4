"""The rebalancing DAG's task library: one function per task.

The DAG (``dags/rebalance.py``) only wires these functions::

    windows -> detect -> plan -> validate -> publish -> (approve) -> apply -> verify

Every function takes plain values (the small dict the previous task returned, or the
run's params and identity) and returns a small JSON-able dict; DataFrames and arrays
never travel between tasks. Everything durable is in Delta
(:mod:`rebalance.spark.plan_store`), and every step is idempotent:

* the plan id is a hash of (dag id, run id, data interval, params, input snapshot:
  histogram table version, windows, base assignment version), and the inputs are
  stored on the plan, so a retried or cleared task of the same run recomputes the
  same id and finds the stored plan instead of planning again;
* every Delta write carries ``txnAppId``/``txnVersion`` derived from the plan id and
  its status, so a retried write adds no table version;
* only one run changes the live assignment at a time: the DAG has
  ``max_active_runs=1``, and :func:`apply` holds a Delta lease (``control`` table)
  and refuses a stale plan (one computed against an assignment version that is no
  longer the latest).

The streaming job routes every micro-batch by the latest version of the
``assignments`` table (:mod:`rebalance.spark.tables`), so writing a version there *is*
the live switch: :func:`publish` stores the validated plan and its full assignment
(``plan_assignments``), and :func:`apply` writes it as the next assignment version,
after approval when the run requires it.

Skips raise :class:`RunSkipped` (Airflow marks the task skipped, with the reason in
its log, and skips what follows); a plan failing validation is stored as rejected and
raises :class:`PlanRejected`, which fails the task without retrying.

Backfill runs (``run_type == "backfill"``) and ``apply_mode="dry-run"`` store a
what-if plan and never touch the live assignment.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from .model import PlanningError, PlanParams, Problem, imbalance
from .planners import METHODS
from .spark.plan_store import (
    APPLY_LEASE,
    LIVE_STATUSES,
    PlanRecord,
    PlanStatus,
    PlanStore,
    PlanStoreError,
    as_utc,
    to_json,
    utcnow,
)
from .trigger import TriggerPolicy, mldc
from .validation import PlanLimits, validate_plan

try:  # the task library runs under Airflow; the CLI (rollback) may run without it
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
except ImportError:  # pragma: no cover - exercised only where Airflow is absent
    class AirflowSkipException(Exception):  # type: ignore[no-redef]
        """Stand-in when Airflow is not installed."""

    class AirflowFailException(Exception):  # type: ignore[no-redef]
        """Stand-in when Airflow is not installed."""

log = logging.getLogger(__name__)

DAG_ID = "rebalance"
APPLY_MODES = ("auto", "broadcast", "restart", "dry-run")

APPLY_LEASE_SECONDS = 600


class RunSkipped(AirflowSkipException):
    """Nothing to do for this run; the message says why. Airflow marks the task skipped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        log.info("skipped: %s", reason)


class InvalidParams(AirflowFailException, ValueError):
    """The run's params are inconsistent; raised before any work, never retried."""


class PlanRejected(AirflowFailException):
    """The plan failed validation; it is stored as rejected and never applied."""


class ApplyRefused(AirflowFailException):
    """The plan cannot be applied (stale, wrong status, or another run holds the lease)."""


class VerificationFailed(AirflowFailException):
    """The realised imbalance after applying did not match the prediction."""


# --------------------------------------------------------------------- params
#: JSON schema of every run param; the DAG turns each entry into an Airflow ``Param``.
PARAMS_SCHEMA: dict[str, dict[str, Any]] = {
    "method": {
        "default": "mixed", "type": "string", "enum": list(METHODS),
        "title": "Planning method",
        "description": "Planner of rebalance.planners (mixed = seed 003 Mixed, milp = seed 002).",
    },
    "theta": {
        "default": 0.1, "type": "number", "exclusiveMinimum": 0, "maximum": 2,
        "title": "Imbalance bound theta",
        "description": "Every instance load must be <= (1 + theta) * mean load.",
    },
    "max_table": {
        "default": 3000, "type": ["integer", "null"], "minimum": 0, "maximum": 10_000_000,
        "title": "Max routing-table size",
        "description": "Bound on keys routed away from their default instance (null: none).",
    },
    "migration_budget": {
        "default": 0.5, "type": ["number", "null"], "minimum": 0, "maximum": 1,
        "title": "Migration budget",
        "description": "Largest fraction of the total state a plan may move (null: none).",
    },
    "lookback_windows": {
        "default": 6, "type": "integer", "minimum": 1, "maximum": 1000,
        "title": "Windows to look back",
        "description": "Plan on the last N histogram windows that start in the data interval.",
    },
    "min_windows": {
        "default": 2, "type": "integer", "minimum": 1, "maximum": 1000,
        "title": "Minimum valid windows",
        "description": "Skip the run when fewer windows with events are stored.",
    },
    "min_events": {
        "default": 1000, "type": "integer", "minimum": 0,
        "title": "Minimum events (seed 004 M)",
        "description": "Skip the run when the windows hold fewer events.",
    },
    "apply_mode": {
        "default": "auto", "type": "string", "enum": list(APPLY_MODES),
        "title": "Apply mode",
        "description": "auto: live switch unless state must move, then controlled restart; "
                       "broadcast: live switch; restart: controlled restart with state "
                       "migration; dry-run: store a what-if plan, apply nothing.",
    },
    "require_approval": {
        "default": False, "type": "boolean",
        "title": "Require approval",
        "description": "Wait for a person to approve or reject the plan in the Airflow UI.",
    },
    "force": {
        "default": False, "type": "boolean",
        "title": "Force",
        "description": "Plan even when the seed 004 trigger rules say the job is balanced.",
    },
    "verify_windows": {
        "default": 1, "type": "integer", "minimum": 1, "maximum": 100,
        "title": "Windows to verify",
        "description": "Windows processed under the new assignment to compare with the prediction.",
    },
    "verify_tolerance": {
        "default": 0.15, "type": "number", "minimum": 0, "maximum": 10,
        "title": "Verification tolerance",
        "description": "Realised imbalance may exceed the predicted one by this much.",
    },
    "restart_timeout_minutes": {
        "default": 15, "type": "number", "exclusiveMinimum": 0, "maximum": 1440,
        "title": "Restart timeout (minutes)",
        "description": "apply_mode restart: roll back to the previous assignment version when "
                       "the job has not acknowledged the restart in time.",
    },
    "verify_timeout_minutes": {
        "default": 30, "type": "number", "exclusiveMinimum": 0, "maximum": 1440,
        "title": "Verification timeout (minutes)",
        "description": "Fail verification when no window under the new assignment arrives in time.",
    },
}


DEFAULT_SCHEDULE = "*/10 * * * *"


def timetable(spec: str | None = None):
    """The DAG's schedule: ``REBALANCE_SCHEDULE`` or ``spec``, default every 10 minutes.

    A cron expression gives clock-aligned intervals (``CronDataIntervalTimetable``); a
    duration such as ``"30s"``, ``"5m"`` or ``"1h"`` gives intervals of that length
    (``DeltaDataIntervalTimetable``, used by the demo). Either way each run's data
    interval is the span of histogram windows it plans on.
    """
    import os
    import re

    from airflow.sdk import CronDataIntervalTimetable, DeltaDataIntervalTimetable

    spec = (spec or os.environ.get("REBALANCE_SCHEDULE") or DEFAULT_SCHEDULE).strip()
    m = re.fullmatch(r"(\d+)\s*([smh])", spec)
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours"}[m.group(2)]
        return DeltaDataIntervalTimetable(dt.timedelta(**{unit: int(m.group(1))}))
    return CronDataIntervalTimetable(spec, timezone="UTC")


@dataclass(frozen=True)
class RunParams:
    """The run's params, validated once (the DAG's JSON schema checks each alone first)."""

    method: str = "mixed"
    theta: float = 0.1
    max_table: int | None = 3000
    migration_budget: float | None = 0.5
    lookback_windows: int = 6
    min_windows: int = 2
    min_events: int = 1000
    apply_mode: str = "auto"
    require_approval: bool = False
    force: bool = False
    verify_windows: int = 1
    verify_tolerance: float = 0.15
    verify_timeout_minutes: float = 30.0
    restart_timeout_minutes: float = 15.0

    def __post_init__(self) -> None:
        # Canonical types, so equal params always hash to the same plan id (30 == 30.0).
        for name in ("theta", "migration_budget", "verify_tolerance", "verify_timeout_minutes",
                     "restart_timeout_minutes"):
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        for name in ("max_table", "lookback_windows", "min_windows", "min_events", "verify_windows"):
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                object.__setattr__(self, name, int(value))

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> RunParams:
        """Params from a mapping (Airflow params), with one clear error for bad input."""
        known = {k: v for k, v in dict(values).items() if k in cls.__dataclass_fields__}
        try:
            p = cls(**known)
        except TypeError as exc:
            raise InvalidParams(f"invalid params: {exc}") from None
        p.check()
        return p

    def check(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.apply_mode not in APPLY_MODES:
            problems.append(f"apply_mode {self.apply_mode!r} is not one of {', '.join(APPLY_MODES)}")
        if not (isinstance(self.theta, (int, float)) and 0 < self.theta <= 2):
            problems.append(f"theta must be in (0, 2], got {self.theta!r}")
        if self.min_windows > self.lookback_windows:
            problems.append(f"min_windows ({self.min_windows}) exceeds lookback_windows "
                            f"({self.lookback_windows}): no run could ever plan")
        if self.migration_budget is not None and not 0 <= self.migration_budget <= 1:
            problems.append(f"migration_budget must be a fraction in [0, 1], got {self.migration_budget!r}")
        if self.max_table is not None and self.max_table < 0:
            problems.append(f"max_table must be >= 0, got {self.max_table!r}")
        if problems:
            raise InvalidParams("invalid params: " + "; ".join(problems))

    def planner_params(self, total_state: float) -> PlanParams:
        budget = None if self.migration_budget is None else self.migration_budget * total_state
        return PlanParams(theta=float(self.theta), max_table=self.max_table, budget_bytes=budget)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunInfo:
    """Who is running: the DAG run's identity and data interval (ISO strings)."""

    dag_id: str
    run_id: str
    run_type: str
    data_interval_start: str | None
    data_interval_end: str | None

    @classmethod
    def of(cls, dag_id: str, run_id: str, run_type: Any, start: Any, end: Any) -> RunInfo:
        run_type = str(getattr(run_type, "value", run_type))
        iso = (lambda t: as_utc(t).isoformat() if t is not None else None)  # noqa: E731
        return cls(str(dag_id), str(run_id), run_type, iso(start), iso(end))

    @property
    def is_backfill(self) -> bool:
        return self.run_type == "backfill"

    @property
    def start(self) -> dt.datetime | None:
        return as_utc(self.data_interval_start)

    @property
    def end(self) -> dt.datetime | None:
        return as_utc(self.data_interval_end)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _unpack(payload: Mapping[str, Any]) -> tuple[RunInfo, RunParams]:
    return RunInfo(**payload["run"]), RunParams(**payload["params"])


#: Runtime settings for the control plane's small Delta tables, applied when the session
#: has none: Delta replays a table's log into 50 partitions by default, which dominates
#: every read and write of a table of a few KB (measured: 41 s -> 11 s per plan cycle).
CONTROL_PLANE_CONF = {"spark.databricks.delta.snapshotPartitions": "2"}


def spark_session():
    """The project session (:func:`rebalance.spark.session.get_spark`), tuned for small tables."""
    from .spark.session import get_spark

    spark = get_spark("rebalance-dag", conf=CONTROL_PLANE_CONF)
    for key, value in CONTROL_PLANE_CONF.items():
        if spark.conf.get(key, None) is None:
            spark.conf.set(key, value)
    return spark


# -------------------------------------------------------------------- windows
def read_windows(params: Mapping[str, Any], dag_id: str, run_id: str, run_type: Any,
                 data_interval_start: Any, data_interval_end: Any) -> dict[str, Any]:
    """Pick the histogram windows of the run's data interval and pin the input snapshot.

    Returns ``{"run", "params", "inputs"}``; ``inputs`` names the windows, their event
    count, the ``key_histograms`` Delta version read, the base assignment version and
    the number of instances. A run that already stored a plan gets that plan's inputs
    back (so its plan id does not change). Raises :class:`RunSkipped` when there are
    too few valid windows or events.
    """
    p = RunParams.parse(params)
    run = RunInfo.of(dag_id, run_id, run_type, data_interval_start, data_interval_end)
    spark = spark_session()
    stored = PlanStore(spark).find_for_run(run.dag_id, run.run_id)
    if stored is not None:
        log.info("run %s already stored plan %s: reusing its inputs", run.run_id, stored.plan_id)
        return {"run": run.to_dict(), "params": p.to_dict(), "inputs": stored.inputs}

    from .spark import tables

    deadline = time.monotonic() + windows_wait_seconds()
    while True:
        # The job creates its tables at start and writes a window once its watermark
        # passed it: give a starting or lagging job the time the service allows
        # (REBALANCE_WINDOWS_WAIT_SECONDS) before skipping. Backfills never wait.
        try:
            if not tables.exists(spark, tables.ASSIGNMENTS):
                raise RunSkipped("no assignments table yet (the streaming job creates it at "
                                 "start): nothing to rebalance")
            version, windows = _interval_windows(spark, run, p.lookback_windows)
            valid = [w for w in windows if w["events"] > 0]
            if len(valid) >= p.min_windows or run.is_backfill or time.monotonic() >= deadline:
                break
        except RunSkipped:
            if run.is_backfill or time.monotonic() >= deadline:
                raise
        time.sleep(WINDOWS_POLL_SECONDS)
    live_version = tables.latest_assignment_version(spark)
    n_instances = tables.assignments_n_instances(spark)
    where = f"[{run.data_interval_start}, {run.data_interval_end})"
    if len(valid) < p.min_windows:
        raise RunSkipped(f"too few valid windows: {len(valid)} with events in {where}, "
                         f"{p.min_windows} required")
    events = int(sum(w["events"] for w in valid))
    if events < p.min_events:
        raise RunSkipped(f"too few events: {events} in {len(valid)} windows of {where}, "
                         f"{p.min_events} required (seed 004 M)")
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
    return {"run": run.to_dict(), "params": p.to_dict(), "inputs": inputs}


#: How often ``windows`` looks again for the interval's windows while it waits.
WINDOWS_POLL_SECONDS = 5.0


def windows_wait_seconds() -> float:
    """How long ``windows`` waits for ``min_windows`` windows of the interval to be written
    before it skips the run (``REBALANCE_WINDOWS_WAIT_SECONDS``, default 0: no wait). The
    service sets it: a scheduled run starts at the end of its interval, while the job
    writes the interval's last windows only once its watermark passed them."""
    import os

    return float(os.environ.get("REBALANCE_WINDOWS_WAIT_SECONDS", "0") or 0)


def _interval_windows(spark, run: RunInfo, lookback: int) -> tuple[int, list[dict[str, Any]]]:
    """Latest key_histograms version and the last ``lookback`` windows starting in the interval."""
    from pyspark.sql import functions as F

    from .spark import tables

    if not tables.exists(spark, tables.KEY_HISTOGRAMS):
        raise RunSkipped(f"no key histograms stored yet at {tables.KEY_HISTOGRAMS.path()}")
    version = int(tables.history(spark, tables.KEY_HISTOGRAMS, limit=1)[0].version)
    df = tables.read(spark, tables.KEY_HISTOGRAMS, version=version)
    if run.end is not None:
        df = df.where(F.col("window_start") < F.lit(run.end))
    if run.start is not None and run.start != run.end:
        df = df.where(F.col("window_start") >= F.lit(run.start))
    rows = (df.groupBy("window_start")
            .agg(F.sum("count").alias("events"), F.max("assignment_version").alias("av"))
            .orderBy(F.col("window_start").desc()).limit(lookback).collect())
    windows = [{"window_start": as_utc(r.window_start).isoformat(), "events": int(r.events or 0),
                "assignment_version": int(r.av or 0)} for r in reversed(rows)]
    return version, windows


# ------------------------------------------------------------------- problem
def load_problem(spark, inputs: Mapping[str, Any]) -> tuple[Problem, dict[str, int]]:
    """The planning problem of the pinned inputs, and the base routing table.

    The histogram rows of the pinned windows (one Delta version of ``key_histograms``)
    go through the same aggregation as ``rebalance plan``
    (:func:`rebalance.histograms.build_problem`): load of a key = its cost per window
    (mean over the windows, absent = 0), state = the state bytes it held at the close
    of its latest window (the job's state is the sliding window of its last w windows:
    seed 003's S(k, w)), current instance = the base assignment version's routing table
    over the default placement. Keys of the routing table without events are planned too.
    """
    from pyspark.sql import functions as F

    from .histograms import build_problem
    from .spark import tables

    windows = list(inputs["windows"])
    n = int(inputs["n_instances"])
    df = (tables.read(spark, tables.KEY_HISTOGRAMS, version=int(inputs["key_histograms_version"]))
          .where(F.col("window_start").isin([as_utc(w) for w in windows]))
          .groupBy("window_start", "key")
          .agg(F.sum("count").alias("count"), F.sum("cost").alias("cost"),
               F.max("state_bytes").alias("state_bytes")))
    pdf = df.toPandas()
    if pdf.empty:
        raise PlanningError(f"no histogram rows in windows {windows}")
    table = tables.read_assignment(spark, version=int(inputs["base_assignment_version"])).routing
    routing = pd.DataFrame({"key": list(table), "instance": list(table.values())})
    problem, _ = build_problem(pdf, n, routing, windows=len(windows))
    return problem, table


def assignment_frame(problem: Problem, assignment: np.ndarray) -> pd.DataFrame:
    """The per-key frame that is stored and validated for a plan."""
    a = np.asarray(assignment)
    return pd.DataFrame({
        "key": problem.keys.astype(str),
        "instance": a,
        "current": problem.current,
        "default": problem.default,
        "load": problem.load,
        "state": problem.state,
        "moved": a != problem.current,
    })


# --------------------------------------------------------------------- detect
def trigger_policy(p: RunParams) -> TriggerPolicy:
    """Seed 004's trigger rules (:mod:`rebalance.trigger`) with the run's ``min_events``."""
    return TriggerPolicy(min_items=int(p.min_events))


def periods_since_last_plan(store: PlanStore, run: RunInfo) -> int | None:
    """Whole schedule periods between the interval of the latest plan that went live
    (another run's) and this run's interval; None when none went live before it."""
    now = run.end or utcnow()
    last = store.last_live_plan_before(now, exclude_run=run.run_id)
    if last is None:
        return None
    period = (run.end - run.start) if run.start and run.end and run.end > run.start else None
    return int((now - last) // period) if period else 0


def detect(windows: Mapping[str, Any]) -> dict[str, Any]:
    """Apply the trigger rules of seed 004 to the current assignment.

    Rebalance only when MLDC (imbalance - 1) exceeds 0.5, at least ``min_events``
    events were processed, and no plan went live in the last 3 schedule periods; the
    fourth rule (the candidate improves MLDC by more than 0.3) is checked by
    :func:`plan`. ``force`` overrides the rules. Raises :class:`RunSkipped` otherwise.
    """
    run, p = _unpack(windows)
    inputs = dict(windows["inputs"])
    if "detect" in inputs:  # replay of a run that already stored its plan
        return {**windows, "inputs": inputs}
    spark = spark_session()
    problem, _ = load_problem(spark, inputs)
    imb = _current_imbalance(problem)
    since = periods_since_last_plan(PlanStore(spark), run)
    # Rules 1-3 now; rule 4 needs the candidate plan and is checked by plan().
    rules_1_to_3 = dataclasses.replace(trigger_policy(p), min_improvement=0.0)
    decision = rules_1_to_3.decide(imb, int(inputs["events"]), since,
                                   predicted_imbalance=1.0, force=p.force)
    inputs["detect"] = {"imbalance": round(imb, 6), "mldc": round(mldc(imb), 6),
                        "events": inputs["events"], "periods_since_last_plan": since,
                        "decision": str(decision)}
    if not decision.trigger:
        raise RunSkipped(f"{decision} (seed 004 trigger rules; set force to plan anyway)")
    log.info("imbalance %.3f (MLDC %.3f) over %d instances: %s", imb, mldc(imb),
             problem.n_instances, decision)
    return {**windows, "inputs": inputs}


def _current_imbalance(problem: Problem) -> float:
    return imbalance(problem.instance_loads(problem.current), problem.active)


# ----------------------------------------------------------------------- plan
def plan_id_for(run: RunInfo, params: RunParams, inputs: Mapping[str, Any]) -> str:
    """Deterministic plan id: hash of the run, its interval, its params and input snapshot."""
    snapshot = {k: inputs[k] for k in ("windows", "key_histograms_version",
                                       "base_assignment_version", "n_instances")}
    payload = {
        "dag_id": run.dag_id, "run_id": run.run_id,
        "data_interval": [run.data_interval_start, run.data_interval_end],
        "params": params.to_dict(), "inputs": snapshot,
    }
    return hashlib.sha256(to_json(payload).encode()).hexdigest()[:20]


def plan(detected: Mapping[str, Any]) -> dict[str, Any]:
    """Compute the plan with the chosen planner and store it (status proposed).

    A retry finds the stored plan by its id and returns it. Raises
    :class:`RunSkipped` when the candidate improves MLDC by no more than 0.3 (the
    fourth trigger rule of seed 004), unless forced.
    """
    from .planners import get_planner

    run, p = _unpack(detected)
    inputs = dict(detected["inputs"])
    plan_id = plan_id_for(run, p, inputs)
    spark = spark_session()
    store = PlanStore(spark)
    stored = store.get(plan_id)
    if stored is not None:
        log.info("plan %s already stored (%s)", plan_id, stored.status)
        return {**detected, "plan": stored.summary()}

    problem, _ = load_problem(spark, inputs)
    inputs.update(n_keys=problem.n_keys, total_state=float(problem.state.sum()))
    result = get_planner(p.method).plan(problem, p.planner_params(float(problem.state.sum())))
    metrics = result.metrics_dict()
    decision = trigger_policy(p).decide(
        metrics["imbalance_before"], int(inputs["events"]),
        inputs["detect"]["periods_since_last_plan"],
        predicted_imbalance=metrics["imbalance_after"], force=p.force)
    if not decision.trigger:
        raise RunSkipped(f"{p.method}: {decision} (seed 004 trigger rules)")
    record = PlanRecord(
        plan_id=plan_id, status=PlanStatus.PROPOSED.value, method=p.method,
        dag_id=run.dag_id, run_id=run.run_id, run_type=run.run_type,
        data_interval_start=run.start, data_interval_end=run.end,
        params=p.to_dict(), metrics=metrics, inputs=inputs, apply_mode=p.apply_mode,
        reasons=list(result.notes),
        base_assignment_version=int(inputs["base_assignment_version"]),
        predicted_imbalance=float(metrics["imbalance_after"]),
    )
    record = store.propose(record, assignment_frame(problem, result.assignment))
    log.info("plan %s (%s): imbalance %.3f -> %.3f, %d keys move (%.1f%% of state)",
             plan_id, p.method, metrics["imbalance_before"], metrics["imbalance_after"],
             metrics["moved_keys"], 100 * metrics["migration_fraction"])
    return {**detected, "plan": record.summary()}


# ------------------------------------------------------------------- rollback
def propose_rollback(to_version: int, dry_run: bool = False) -> dict[str, Any]:
    """The ``rebalance_rollback`` DAG's first task: store the plan restoring ``to_version``
    (:func:`rebalance.audit.propose_rollback`); then validate, publish and apply as any plan."""
    from .audit import propose_rollback as propose

    try:
        return propose(spark_session(), int(to_version), dry_run=dry_run)
    except (LookupError, ValueError) as exc:
        raise InvalidParams(f"cannot roll back to assignment version {to_version}: {exc}") from None


# ------------------------------------------------------------------- validate
def plan_limits(record: PlanRecord, theta: float | None = None) -> PlanLimits:
    """The bounds a stored plan must meet: its params, and the number of keys, total
    state and instances of its inputs (never the planner's own report)."""
    p = RunParams(**{k: v for k, v in record.params.items() if k in RunParams.__dataclass_fields__})
    budget = (None if p.migration_budget is None
              else p.migration_budget * float(record.inputs["total_state"]))
    return PlanLimits(
        n_instances=int(record.inputs["n_instances"]),
        theta=float(p.theta if theta is None else theta),
        expected_keys=int(record.inputs["n_keys"]),
        max_table=p.max_table,
        budget_bytes=budget,
    )


def validate(planned: Mapping[str, Any]) -> dict[str, Any]:
    """Check the stored plan with the Great Expectations gate of :mod:`rebalance.validation`.

    Every key exactly once, instances in range, no nulls, predicted imbalance <= 1 +
    theta, migration within budget, table size within bound, and every reported metric
    equal to the one recomputed from the assignment. A failing plan is stored as
    rejected with the reasons, and :class:`PlanRejected` fails the task loudly.
    """
    plan_id = planned["plan"]["plan_id"]
    store = PlanStore(spark_session())
    record = store.require(plan_id)
    if record.status == PlanStatus.REJECTED.value:
        raise PlanRejected(f"plan {plan_id} was rejected: " + "; ".join(record.reasons))
    if record.status != PlanStatus.PROPOSED.value:
        return {**planned, "plan": record.summary()}
    result = validate_plan(store.frame(plan_id), record.metrics, plan_limits(record))
    if not result.success:
        record = store.transition(plan_id, PlanStatus.REJECTED, action="reject",
                                  reasons=list(result.failures), validation=result.statistics)
        raise PlanRejected(f"plan {plan_id} rejected by validation, not applied: "
                           + "; ".join(result.failures))
    record = store.transition(plan_id, PlanStatus.VALIDATED, action="validate",
                              validation=result.statistics)
    log.info("plan %s: %s", plan_id, result.summary())
    return {**planned, "plan": record.summary()}


# -------------------------------------------------------------------- publish
def publish(validated: Mapping[str, Any]) -> dict[str, Any]:
    """Publish the validated plan: cleared for apply, or stored as a what-if plan.

    The plan row records the decision in one commit annotated with dag id, run id, plan
    id, method and metrics; its full assignment is already in ``plan_assignments``.
    Backfill runs and ``apply_mode="dry-run"`` store the plan as what-if: it is never
    applied and the live assignment is untouched.
    """
    run, p = _unpack(validated)
    plan_id = validated["plan"]["plan_id"]
    store = PlanStore(spark_session())
    record = store.require(plan_id)
    if record.status == PlanStatus.VALIDATED.value:
        if run.is_backfill or p.apply_mode == "dry-run":
            why = "backfill run" if run.is_backfill else "apply_mode=dry-run"
            record = store.transition(plan_id, PlanStatus.WHAT_IF, action="what-if",
                                      reasons=[*record.reasons, f"what-if only: {why}"])
            log.info("plan %s stored as what-if (%s); the live assignment is untouched",
                     plan_id, why)
        else:
            record = store.transition(plan_id, PlanStatus.PUBLISHED, action="publish")
            log.info("plan %s published: %d keys move, imbalance %.3f -> %.3f", plan_id,
                     record.metrics["moved_keys"], record.metrics["imbalance_before"],
                     record.predicted_imbalance)
    elif record.status not in (PlanStatus.PUBLISHED.value, PlanStatus.WHAT_IF.value,
                               *LIVE_STATUSES):
        raise ApplyRefused(f"plan {plan_id} is {record.status}: only a validated plan is published")
    return {**validated, "plan": record.summary()}


def new_routing(store: PlanStore, record: PlanRecord) -> dict[str, int]:
    """Routing table of a plan's assignment: planned keys off their default instance,
    plus the base version's entries for keys the plan did not see (kept as they are)."""
    from .spark import tables

    frame = store.frame(record.plan_id)
    base = tables.read_assignment(store.spark, version=record.base_assignment_version or 0).routing
    planned = set(frame["key"])
    routing = {k: v for k, v in base.items() if k not in planned}
    routed = frame.loc[frame["instance"] != frame["default"]]
    routing.update(zip(routed["key"].astype(str), routed["instance"].astype(int)))
    return dict(sorted(routing.items()))


def needs_approval(published: Mapping[str, Any]) -> bool:
    """True when the run asked for a person's approval of a plan that would go live."""
    _, p = _unpack(published)
    return bool(p.require_approval) and published["plan"]["status"] == PlanStatus.PUBLISHED.value


# ---------------------------------------------------------------------- apply
def resolve_mode(apply_mode: str) -> str:
    """The apply mode used: ``auto`` is a live switch with the current streaming job.

    The job re-reads the assignments table every micro-batch, so a new version is a
    live switch; a moved key restarts its sliding-window state on its new instance (the
    plan's migration metric counts that state). ``restart`` asks a restartable job
    (:class:`rebalance.streaming.restart.RestartableJob`, which pins its assignment
    version) to stop, migrate the state of the moved keys and restart with the new
    version; :func:`await_restart` waits for its acknowledgement.
    """
    return "broadcast" if apply_mode == "auto" else apply_mode


class RestartFailed(AirflowFailException):
    """The controlled restart failed or timed out; the previous assignment was restored."""


def job_name() -> str:
    """Name of the restartable streaming job the DAG controls (``REBALANCE_JOB_NAME``)."""
    import os

    return os.environ.get("REBALANCE_JOB_NAME", "keyed")


def apply(published: Mapping[str, Any]) -> dict[str, Any]:
    """Make the published plan live: write its routing table as the next assignment version.

    One Delta commit on ``assignments`` (annotated with dag id, run id, plan id, method
    and metrics); the streaming job uses it from its next micro-batch on. Holds the
    apply lease, refuses a stale plan (another version was published since it was
    computed), and finds its own earlier publish on a retry instead of writing again.
    Backfill and what-if plans are never applied.
    """
    from .spark import tables

    run, p = _unpack(published)
    plan_id = published["plan"]["plan_id"]
    spark = spark_session()
    store = PlanStore(spark)
    record = store.require(plan_id)
    if record.status in LIVE_STATUSES:
        return {**published, "plan": record.summary()}
    if run.is_backfill or record.status == PlanStatus.WHAT_IF.value:
        raise RunSkipped(f"plan {plan_id} is a what-if plan ({run.run_type} run, apply_mode "
                         f"{p.apply_mode}): backfill and dry-run never apply")
    if record.status != PlanStatus.PUBLISHED.value:
        raise ApplyRefused(f"plan {plan_id} is {record.status}: only a published plan is applied")
    mode = resolve_mode(p.apply_mode)
    try:
        with store.lease(APPLY_LEASE, plan_id, APPLY_LEASE_SECONDS):
            version, applied_at = published_version(spark, plan_id)
            if version is None:
                latest = tables.latest_assignment_version(spark)
                if latest != record.base_assignment_version:
                    raise ApplyRefused(
                        f"stale plan {plan_id}: computed against assignment version "
                        f"{record.base_assignment_version}, but version {latest} was published "
                        "since; the next run plans again")
                routing = new_routing(store, record)
                version = tables.publish_assignment(
                    spark, routing, int(record.inputs["n_instances"]),
                    metadata={"action": "apply", **record.commit_values(), "apply_mode": mode})
                applied_at = utcnow()
            if mode == "restart":
                from .streaming.restart import request_restart

                # Idempotent: the request id is the plan id (one Delta transaction).
                request_restart(spark, version, int(record.inputs["n_instances"]),
                                job=job_name(), request_id=plan_id,
                                previous_version=record.base_assignment_version)
            record = store.transition(
                plan_id, PlanStatus.APPLIED, action="apply", apply_mode=mode,
                assignment_version=version,
                verification={"applied_at": applied_at, "mode": mode})
    except PlanStoreError as exc:
        raise ApplyRefused(str(exc)) from None
    log.info("plan %s applied (%s): assignment version %d is live", plan_id, mode, version)
    return {**published, "plan": record.summary()}


def published_version(spark, plan_id: str) -> tuple[int | None, dt.datetime | None]:
    """The assignment version a plan was published as, from the Delta history (or None)."""
    from .spark import tables

    for commit in tables.assignment_history(spark):
        if commit.metadata.get("plan_id") == plan_id:
            return int(commit.version), as_utc(commit.timestamp)
    return None, None


# -------------------------------------------------------------- await restart
def await_restart(applied: Mapping[str, Any]) -> dict[str, Any]:
    """Wait for the streaming job to acknowledge a controlled restart (``apply_mode`` restart).

    Returns ``{"is_done": True}`` at once for a live switch, and when the job recorded
    ``acknowledged`` for the plan's restart request (table ``restarts``); ``is_done``
    False while it is under way (the DAG's sensor pokes again). When the job recorded
    that the restart failed and was rolled back, or after ``restart_timeout_minutes``
    (the request is then cancelled, unless the new generation already started), the
    previous assignment version is restored as a new version (action ``rollback``),
    the plan is stored as diverged with the reason, and :class:`RestartFailed` fails
    the task.
    """
    from .streaming.restart import RestartControl

    _, p = _unpack(applied)
    plan_id = applied["plan"]["plan_id"]
    if applied["plan"].get("apply_mode") != "restart":
        return {"is_done": True, "xcom_value": applied}
    spark = spark_session()
    store = PlanStore(spark)
    record = store.require(plan_id)
    if record.status == PlanStatus.DIVERGED.value:
        raise RestartFailed(f"plan {plan_id}: " + "; ".join(record.reasons))
    control = RestartControl(spark, job_name())
    status = control.status(plan_id)
    if status["ok"]:
        log.info("restart %s acknowledged: assignment version %d live, pause %s s", plan_id,
                 record.assignment_version, status.get("pause_seconds"))
        return {"is_done": True, "xcom_value": applied}
    waited = utcnow() - (record.applied_at or utcnow())
    if not status["done"] and waited > dt.timedelta(minutes=p.restart_timeout_minutes):
        control.record(plan_id, "cancelled", reason=f"no acknowledgement after {waited}")
        status = control.status(plan_id)
        if not status["cancelled"]:
            log.info("restart %s timed out but its new generation started: waiting", plan_id)
            return {"is_done": False, "xcom_value": None}
        status = {**status, "error": status.get("error") or f"timed out after {waited}"}
    elif not status["done"]:
        log.info("waiting for the job to restart with assignment version %d (%s)",
                 record.assignment_version, status["state"])
        return {"is_done": False, "xcom_value": None}
    restored = roll_back_assignment(spark, record)
    reason = (f"controlled restart failed ({status.get('error') or status['state']}); "
              f"assignment version {record.base_assignment_version} restored as version "
              f"{restored}")
    store.transition(plan_id, PlanStatus.DIVERGED, action="restart-rollback",
                     reasons=[*record.reasons, reason],
                     verification={**record.verification, "restart": status["state"],
                                   "rollback_version": restored})
    raise RestartFailed(f"plan {plan_id}: {reason}")


def roll_back_assignment(spark, record: PlanRecord) -> int:
    """Publish the plan's base assignment again as the newest version (once per plan)."""
    from .spark import tables

    for commit in tables.assignment_history(spark):
        if commit.metadata.get("rollback_of") == record.plan_id:
            return int(commit.version)
    base = tables.read_assignment(spark, version=record.base_assignment_version or 0)
    return tables.publish_assignment(
        spark, base.routing, int(record.inputs["n_instances"]),
        metadata={"action": "rollback", "rollback_of": record.plan_id,
                  "restores_version": base.version, "dag_id": record.dag_id,
                  "run_id": record.run_id})


# --------------------------------------------------------------------- verify
def verify(applied: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the realised imbalance of the next window(s) with the prediction.

    Looks for ``verify_windows`` windows processed entirely under the new assignment
    version (rows of ``key_histograms`` tagged with it). Returns
    ``{"is_done": False, ...}`` while they have not arrived (the DAG's sensor pokes
    again) and fails after ``verify_timeout_minutes``. Records the realised imbalance
    on the plan: status verified when it is at most predicted + ``verify_tolerance``,
    otherwise diverged, and the task fails.
    """
    _, p = _unpack(applied)
    plan_id = applied["plan"]["plan_id"]
    spark = spark_session()
    store = PlanStore(spark)
    record = store.require(plan_id)
    if record.status in (PlanStatus.VERIFIED.value, PlanStatus.DIVERGED.value):
        return _verified(record)
    if record.status != PlanStatus.APPLIED.value:
        raise RunSkipped(f"plan {plan_id} is {record.status}: nothing was applied to verify")
    realised, windows = realised_imbalance(spark, record.assignment_version,
                                           int(record.inputs["n_instances"]), p.verify_windows)
    if realised is None:
        waited = utcnow() - (record.applied_at or utcnow())
        if waited > dt.timedelta(minutes=p.verify_timeout_minutes):
            raise VerificationFailed(
                f"plan {plan_id}: no complete window under assignment version "
                f"{record.assignment_version} after {waited}; is the streaming job running?")
        log.info("waiting for %d window(s) under assignment version %d (%d so far)",
                 p.verify_windows, record.assignment_version, len(windows))
        return {"is_done": False, "xcom_value": None}
    predicted = float(record.predicted_imbalance)
    ok = realised <= predicted + p.verify_tolerance
    status = PlanStatus.VERIFIED if ok else PlanStatus.DIVERGED
    record = store.transition(
        plan_id, status, action="verify", realised_imbalance=realised,
        verification={**record.verification, "windows": windows, "predicted": predicted,
                      "realised": realised, "tolerance": p.verify_tolerance, "matches": ok})
    return _verified(record)


def _verified(record: PlanRecord) -> dict[str, Any]:
    if record.status == PlanStatus.DIVERGED.value:
        raise VerificationFailed(
            f"plan {record.plan_id}: realised imbalance {record.realised_imbalance:.3f} exceeds "
            f"the predicted {record.predicted_imbalance:.3f} + tolerance "
            f"{record.verification.get('tolerance')}")
    log.info("plan %s verified: realised imbalance %.3f, predicted %.3f", record.plan_id,
             record.realised_imbalance, record.predicted_imbalance)
    return {"is_done": True, "xcom_value": record.summary()}


def realised_imbalance(spark, version: int, n_instances: int,
                       n_windows: int) -> tuple[float | None, list[str]]:
    """Imbalance over the first ``n_windows`` complete windows run under ``version``.

    A window counts when every one of its rows carries ``version`` (the switch did not
    happen inside it). Returns (None, windows found) while there are not enough.
    """
    from pyspark.sql import functions as F

    from .spark import tables

    df = tables.read(spark, tables.KEY_HISTOGRAMS)
    per_window = (df.groupBy("window_start")
                  .agg(F.min("assignment_version").alias("lo"),
                       F.max("assignment_version").alias("hi"))
                  .where((F.col("lo") == version) & (F.col("hi") == version))
                  .orderBy("window_start").limit(n_windows).collect())
    windows = [as_utc(r.window_start) for r in per_window]
    if len(windows) < n_windows:
        return None, [w.isoformat() for w in windows]
    loads = (df.where(F.col("window_start").isin(windows))
             .groupBy("instance").agg(F.sum("cost").alias("load")).collect())
    vector = np.zeros(max(n_instances, 1 + max((int(r.instance) for r in loads), default=0)))
    for r in loads:
        vector[int(r.instance)] += float(r.load)
    active = np.zeros(len(vector), dtype=bool)
    active[:n_instances] = True
    return float(imbalance(vector, active)), [w.isoformat() for w in windows]
