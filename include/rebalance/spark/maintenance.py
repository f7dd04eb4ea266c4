"""Delta table maintenance: expire old rows, compact, VACUUM, checkpoint the log.

Four steps, run per table in this order by the DAG ``rebalance_maintenance``, each returning
its figures as a JSON-able dict: ``expire`` (DELETE rows older than the table's retention,
counted back from the newest window written, never a window a stored plan names),
``optimize`` (Z-order by ``window_start`` where the table has it), ``vacuum`` (default 168 h)
and ``checkpoint``. Plans, plan frames, assignments, restarts and leases are never expired;
no step changes a table property, and a DELETE or OPTIMIZE that loses Delta's concurrency
check is retried on a fresh snapshot. Retention per table, why it is safe beside the job,
the Delta behaviours relied on: ``docs/maintenance.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rebalance.core.records import as_utc, commit_metadata, utcnow
from rebalance.spark import delta_rs, object_store, tables
from rebalance.spark.delta_rs import commit_versions
from rebalance.spark.plan_store import CONTROL, PLAN_ASSIGNMENTS, PLANS, delta_txn, is_conflict
from rebalance.spark.session import session_confs
from rebalance.spark.tables import Table

log = logging.getLogger(__name__)

DAG_ID = "rebalance_maintenance"
#: The DAG's schedule when ``REBALANCE_MAINTENANCE_SCHEDULE`` is not set: daily at 03:00
#: UTC, beside the running job (its Delta ``events`` stream skips change commits, and its
#: liveness check skips maintenance commits: docs/maintenance.md).
DEFAULT_SCHEDULE = "0 3 * * *"
SCHEDULE_ENV = "REBALANCE_MAINTENANCE_SCHEDULE"
#: Delta's default ``delta.deletedFileRetentionDuration``: VACUUM's safety floor, and how
#: far back Delta 4.4 allows time travel at all.
DELTA_FILE_RETENTION_HOURS = 168
MAX_RETENTION_DAYS = 3650
#: A retention shorter than this would delete windows a running DAG run may still read.
MIN_RETENTION = dt.timedelta(hours=1)
CONFLICT_RETRIES = 8
CONFLICT_BACKOFF_SECONDS = 0.5
RETENTION_WINDOW_IGNORE = "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled"
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
#: VACUUM lists the table folder in this many tasks; set to the session's shuffle partitions
#: for the statement, as Spark's default (10 000 tasks) turns a small table's VACUUM into a
#: minute of scheduling (figures: docs/maintenance.md, "Delta 4.4 behaviours").
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
#: History operations that change no data: an OPTIMIZE before them still holds.
NO_DATA_CHANGE = {"OPTIMIZE", "VACUUM START", "VACUUM END", "CREATE TABLE", "SET TBLPROPERTIES",
                  "UNSET TBLPROPERTIES", "ADD COLUMNS", "CHANGE COLUMN", "UPGRADE PROTOCOL"}


class MaintenanceParamError(ValueError):
    """A maintenance parameter is out of range, or names an unknown table or step."""


class MaintenanceError(RuntimeError):
    """A step failed on some tables after its retries (the other tables were done)."""


@dataclass(frozen=True)
class Policy:
    """What maintenance does to one table."""

    table: Table
    #: The :class:`MaintenanceParams` field with the retention in days; None: never expired.
    retention: str | None = None
    time_column: str | None = None
    protect_plan_windows: bool = False
    zorder: bool = False
    no_optimize: str | None = None   # why OPTIMIZE is not run, else None
    no_vacuum: str | None = None     # why VACUUM is not run, else None


_HISTOGRAMS = dict(retention="histograms_retention_days", time_column="window_start",
                   protect_plan_windows=True, zorder=True)
#: Every maintained table, in the order the steps visit them.
POLICIES: dict[str, Policy] = {p.table.name: p for p in (
    Policy(tables.EVENTS, retention="events_retention_days", time_column="event_time"),
    Policy(tables.QUARANTINE),
    Policy(tables.RESULTS, retention="results_retention_days", time_column="window_start",
           zorder=True),
    Policy(tables.WINDOW_RESULTS, retention="results_retention_days",
           time_column="window_start", zorder=True),
    Policy(tables.KEY_HISTOGRAMS, **_HISTOGRAMS),
    Policy(tables.INSTANCE_HISTOGRAMS, **_HISTOGRAMS),
    Policy(tables.RESTARTS),
    Policy(tables.JOBS),
    Policy(PLANS),
    Policy(PLAN_ASSIGNMENTS),
    Policy(CONTROL, no_optimize="one lease row, rewritten by every UPDATE: nothing to compact, "
                                "and a lease UPDATE losing to an OPTIMIZE reads as a lost lease"),
    Policy(tables.ASSIGNMENTS,
           no_optimize="every publish overwrites the table (nothing to compact) and does not "
                       "retry a conflict; its row commit versions name the assignment version",
           no_vacuum="every assignment version stays readable by number (rollback, audit): "
                     "each is a few KB"),
)}

#: JSON schema of the DAG's Params (each becomes an Airflow ``Param``), with defaults.
PARAMS_SCHEMA: dict[str, dict[str, Any]] = {
    "histograms_retention_days": {
        "type": "number", "minimum": 0, "maximum": MAX_RETENTION_DAYS, "default": 14,
        "title": "Keep histogram windows for (days)",
        "description": "key_histograms and instance_histograms rows whose window starts more "
                       "than this many days before the newest window are deleted, except the "
                       "windows a stored plan planned or was verified on. 0: keep all.",
    },
    "results_retention_days": {
        "type": "number", "minimum": 0, "maximum": MAX_RETENTION_DAYS, "default": 7,
        "title": "Keep per-batch results for (days)",
        "description": "results rows whose window starts more than this many days before the "
                       "newest window are deleted. 0: keep all.",
    },
    "events_retention_days": {
        "type": "number", "minimum": 0, "maximum": MAX_RETENTION_DAYS, "default": 0,
        "title": "Keep raw events for (days)",
        "description": "events whose event time is more than this many days before the newest "
                       "histogram window are deleted. 0 (default): keep all. The job's Delta "
                       "stream of events skips these deletions (docs/maintenance.md).",
    },
    "vacuum_retention_hours": {
        "type": "integer", "minimum": 1, "maximum": 24 * MAX_RETENTION_DAYS,
        "default": DELTA_FILE_RETENTION_HOURS,
        "title": "VACUUM retention (hours)",
        "description": "Files a table no longer uses are deleted this long after they were "
                       "replaced. Default 168 (7 days): Delta's own retention and the floor of "
                       "its safety check; Delta 4.4 allows time travel within 7 days only.",
    },
    "vacuum_below_safety_check": {
        "type": "boolean", "default": False,
        "title": "Allow VACUUM below 7 days",
        "description": "Needed for a VACUUM retention below the table's "
                       "delta.deletedFileRetentionDuration (7 days): files that a lagging "
                       "stream or a long query still reads may be deleted.",
    },
    "tables": {
        "type": "array", "items": {"type": "string", "enum": list(POLICIES)},
        "uniqueItems": True, "minItems": 1, "default": list(POLICIES),
        "title": "Tables",
        "description": "The tables to maintain (default: all).",
    },
}
RETENTION_PARAMS = ("histograms_retention_days", "results_retention_days", "events_retention_days")


@dataclass(frozen=True)
class MaintenanceParams:
    """The maintenance parameters, validated once (:meth:`parse`)."""

    histograms_retention_days: float = 14.0
    results_retention_days: float = 7.0
    events_retention_days: float = 0.0
    vacuum_retention_hours: int = DELTA_FILE_RETENTION_HOURS
    vacuum_below_safety_check: bool = False
    tables: tuple[str, ...] = tuple(POLICIES)

    @classmethod
    def parse(cls, values: Mapping[str, Any] | MaintenanceParams | None = None) -> MaintenanceParams:
        """Check the values (a DAG run's params, a dict); raise :class:`MaintenanceParamError`."""
        if isinstance(values, MaintenanceParams):
            return values
        values = {k: values[k] for k in values} if values else {}
        unknown = sorted(set(values) - set(PARAMS_SCHEMA))
        if unknown:
            raise MaintenanceParamError(f"unknown maintenance param(s) {', '.join(unknown)}; "
                                        f"known: {', '.join(PARAMS_SCHEMA)}")
        out: dict[str, Any] = {}
        for name in RETENTION_PARAMS:
            if name in values:
                out[name] = _days(name, values[name])
        if "vacuum_retention_hours" in values:
            out["vacuum_retention_hours"] = _hours(values["vacuum_retention_hours"])
        if "vacuum_below_safety_check" in values:
            flag = values["vacuum_below_safety_check"]
            if not isinstance(flag, bool):
                raise MaintenanceParamError(f"vacuum_below_safety_check must be true or false, "
                                            f"got {flag!r}")
            out["vacuum_below_safety_check"] = flag
        if "tables" in values:
            out["tables"] = table_names(values["tables"])
        params = cls(**out)
        if (params.vacuum_retention_hours < DELTA_FILE_RETENTION_HOURS
                and not params.vacuum_below_safety_check):
            raise MaintenanceParamError(
                f"vacuum_retention_hours {params.vacuum_retention_hours} is below Delta's "
                f"safety check ({DELTA_FILE_RETENTION_HOURS} h): set vacuum_below_safety_check "
                "to go below it")
        return params

    def retention(self, policy: Policy) -> dt.timedelta | None:
        """The table's retention, None when it is never expired (or its retention is 0)."""
        days = getattr(self, policy.retention) if policy.retention else 0
        return dt.timedelta(days=days) if days > 0 else None


def _number(name: str, value: Any, unit: str, top: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MaintenanceParamError(f"{name} must be a number of {unit}, got {value!r}")
    if not 0 <= value <= top:
        raise MaintenanceParamError(f"{name} must be within [0, {top:g}] {unit}, got {value!r}")
    return float(value)


def _days(name: str, value: Any) -> float:
    days = _number(name, value, "days", MAX_RETENTION_DAYS)
    if 0 < days and dt.timedelta(days=days) < MIN_RETENTION:
        raise MaintenanceParamError(f"{name} must be 0 (keep every row) or at least 1 hour "
                                    f"({1 / 24:.4f} days), got {value!r}")
    return days


def _hours(value: Any) -> int:
    hours = _number("vacuum_retention_hours", value, "hours", 24 * MAX_RETENTION_DAYS)
    if hours != int(hours) or hours < 1:
        raise MaintenanceParamError(f"vacuum_retention_hours must be a whole number of hours "
                                    f">= 1, got {value!r}")
    return int(hours)


def table_names(names: Any) -> tuple[str, ...]:
    """The maintained tables named (a list, or one comma-separated string), checked."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not isinstance(names, (list, tuple)) or not names:
        raise MaintenanceParamError(f"tables must be a non-empty list of table names, got {names!r}")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise MaintenanceParamError(f"unknown table {unknown[0]!r}; maintained tables: "
                                    f"{', '.join(POLICIES)}")
    return tuple(dict.fromkeys(names))


def policy_of(name: str) -> Policy:
    return POLICIES[table_names([name])[0]]


def schedule(spec: str | None = None) -> str | None:
    """The DAG's schedule: ``spec``, else ``REBALANCE_MAINTENANCE_SCHEDULE``, else
    :data:`DEFAULT_SCHEDULE`; a cron expression or preset (``@hourly``); ``none`` for
    manual runs only."""
    spec = (spec or os.environ.get(SCHEDULE_ENV) or DEFAULT_SCHEDULE).strip()
    return None if spec.lower() in ("none", "manual") else spec


# ----------------------------------------------------------------- pure helpers
def retention_cutoff(newest: Any, retention: dt.timedelta | None,
                     now: dt.datetime | None = None) -> dt.datetime | None:
    """Rows before this instant are expired: the newest window (or now, if the newest lies
    in the future) minus the retention. None when the table is empty or kept whole."""
    newest = as_utc(newest)
    if newest is None or retention is None:
        return None
    return min(newest, as_utc(now) or utcnow()) - retention


def protected_windows(plans: Iterable[Mapping[str, Any]]) -> set[dt.datetime]:
    """Every window a plan names: its input windows (``inputs.windows``) and the windows
    its verification measured (``verification.windows``); JSON strings are parsed."""
    out: set[dt.datetime] = set()
    for plan in plans:
        for part in ("inputs", "verification"):
            value = plan.get(part) or {}
            if isinstance(value, str):
                value = json.loads(value) if value.strip() else {}
            for window in value.get("windows") or ():
                stamp = as_utc(window)
                if stamp is not None:
                    out.add(stamp)
    return out


def expiry_condition(time_column: str, cutoff: dt.datetime,
                     protected: Iterable[dt.datetime] = ()) -> str:
    """SQL condition of the rows to expire: before ``cutoff`` and in no protected window.
    ``event_time`` is text; it is parsed as the job parses it (unparsable: kept)."""
    column = ("try_cast(trim(event_time) AS TIMESTAMP)" if time_column == "event_time"
              else f"`{time_column}`")
    condition = f"{column} < {tables.sql_literal(cutoff)}"
    keep = sorted(w for w in protected if w < cutoff)
    if keep:
        condition += f" AND {column} NOT IN (" + ", ".join(map(tables.sql_literal, keep)) + ")"
    return condition


_UNITS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1, "day": 24, "week": 168}


def interval_hours(text: str | None, default: float = DELTA_FILE_RETENTION_HOURS) -> float:
    """Hours of a Delta interval property (``interval 1 weeks``, ``168 hours``)."""
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*", (text or "").lower())
    if not m or m.group(2) not in _UNITS:
        return float(default)
    return float(m.group(1)) * _UNITS[m.group(2)]


# ------------------------------------------------------------------ Delta helpers
def _sql(policy: Policy, root: str | Path | None) -> str:
    return tables.sql_name(policy.table, root)


def _detail(spark, policy: Policy, root) -> Any:
    return spark.sql(f"DESCRIBE DETAIL {_sql(policy, root)}").first()


def _version(spark, policy: Policy, root) -> int:
    """The table's newest version (delta-rs; ``spark`` is not used)."""
    return int(delta_rs.version(policy.table.path(root)))


def _files_on_disk(path: str) -> int:
    """Parquet files in the table's folder (live and replaced), local or on the object
    store: one recursive listing."""
    import pyarrow.fs as pafs

    fs, base = object_store.filesystem(path)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return sum(1 for i in infos
               if i.path.endswith(".parquet") and "_delta_log" not in i.path.split("/"))


def _log_entries(path: str) -> int:
    return len(commit_versions(path))


@contextmanager
def _annotated(spark, step: str, policy: Policy, confs: Mapping[str, str] | None = None, **extra):
    """Run the block's Delta commands with the step in ``userMetadata`` (the table's history
    shows what maintenance did) and with ``confs`` set on the session, restored after."""
    meta = commit_metadata(kind="maintenance", step=step, table=policy.table.name, **extra)
    with session_confs(spark, confs or {}), delta_txn(spark, None, None, meta):
        yield


def _retrying(what: str, action: Callable[[], Any]) -> tuple[Any, int]:
    """``action()`` and the number of retries it took: a Delta concurrent-commit conflict
    (another writer won the commit) is retried on a fresh snapshot, with back-off."""
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            return action(), attempt
        except Exception as exc:  # noqa: BLE001 - only Delta's concurrent-commit conflicts
            if not is_conflict(exc) or attempt == CONFLICT_RETRIES:
                raise
            log.info("%s: concurrent commit (%s), retry %d", what, tables.spark_message(exc, 120),
                     attempt + 1)
            time.sleep(min(CONFLICT_BACKOFF_SECONDS * 2 ** attempt, 10.0))
    raise AssertionError("unreachable")


def _changed_since_optimize(spark, policy: Policy, root, limit: int = 200) -> bool:
    """Whether a commit changed data since the table's last OPTIMIZE (within ``limit``;
    the history through delta-rs, ``spark`` is not used)."""
    for commit in delta_rs.history(policy.table.path(root), int(limit)):  # newest first
        if commit.operation == "OPTIMIZE":
            return False
        if commit.operation not in NO_DATA_CHANGE:
            return True
    return True


def plan_windows(spark, root: str | Path | None = None) -> set[dt.datetime]:
    """The windows every stored plan names (:func:`protected_windows` of the plans table)."""
    if not tables.exists(spark, PLANS, root):
        return set()
    rows = spark.read.format("delta").load(PLANS.path(root)).select("inputs", "verification")
    return protected_windows(r.asDict() for r in rows.collect())


def _newest_window(spark, table: Table, root) -> dt.datetime | None:
    """From the files' statistics (:func:`rebalance.spark.delta_rs.max_value`)."""
    return as_utc(delta_rs.max_value(table.path(root), "window_start"))


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _begin(spark, step: str, name: str, root, skip: str = "") -> tuple[Policy, dict[str, Any]]:
    """The table's policy and its figures so far; ``skipped`` says why when the step has
    nothing to do (the policy's ``skip`` reason, or no table)."""
    policy = policy_of(name)
    out: dict[str, Any] = {"table": name, "step": step}
    why = getattr(policy, skip) if skip else None
    if why or not tables.exists(spark, policy.table, root):
        out["skipped"] = why or "no table"
    return policy, out


# -------------------------------------------------------------------------- steps
def expire(spark, name: str, params: Any = None, root: str | Path | None = None,
           now: dt.datetime | None = None) -> dict[str, Any]:
    """Delete the table's rows older than its retention, keeping every plan's windows."""
    policy, out = _begin(spark, "expire", name, root)
    params = MaintenanceParams.parse(params)
    retention = params.retention(policy)
    if retention is None:
        why = "never expired" if policy.retention is None else f"{policy.retention} is 0: kept"
        return {**out, "skipped": why}
    if "skipped" in out:
        return out
    # events: from what the job has processed (the histograms), not from what arrived.
    basis = tables.KEY_HISTOGRAMS if policy.time_column == "event_time" else policy.table
    newest = _newest_window(spark, basis, root)
    cutoff = retention_cutoff(newest, retention, now)
    if cutoff is None:
        return {**out, "skipped": f"no windows in {basis.name} yet"}
    protected = plan_windows(spark, root) if policy.protect_plan_windows else set()
    condition = expiry_condition(policy.time_column, cutoff, protected)
    out.update(retention_hours=retention.total_seconds() / 3600, newest_window=_iso(newest),
               cutoff=_iso(cutoff), protected_windows=sum(1 for w in protected if w < cutoff))

    def delete() -> int:  # a DELETE that matches no file commits nothing
        with _annotated(spark, "expire", policy, cutoff=_iso(cutoff)):
            rows = spark.sql(f"DELETE FROM {_sql(policy, root)} WHERE {condition}").collect()
        return int(rows[0][0]) if rows else 0

    deleted, retries = _retrying(f"expire {name}", delete)
    out.update(rows_deleted=deleted, version=_version(spark, policy, root), retries=retries)
    log.info("expire %s: %d row(s) before %s deleted (%d plan window(s) kept), %d retries",
             name, deleted, out["cutoff"], out["protected_windows"], retries)
    return out


def optimize(spark, name: str, params: Any = None, root: str | Path | None = None,
             now: dt.datetime | None = None) -> dict[str, Any]:
    """Compact the table's small files (Z-ordered by ``window_start`` where it has one)."""
    policy, out = _begin(spark, "optimize", name, root, "no_optimize")
    if "skipped" in out:
        return out
    before = int(_detail(spark, policy, root).numFiles)
    out.update(files_before=before, zorder_by="window_start" if policy.zorder else None)
    if before <= 1 or not _changed_since_optimize(spark, policy, root):
        why = f"{before} file(s)" if before <= 1 else "no data change since the last OPTIMIZE"
        return {**out, "files_after": before, "skipped": why}
    statement = f"OPTIMIZE {_sql(policy, root)}" + (" ZORDER BY (window_start)"
                                                     if policy.zorder else "")

    def run() -> Any:
        with _annotated(spark, "optimize", policy):
            return spark.sql(statement).first().metrics

    metrics, retries = _retrying(f"optimize {name}", run)
    out.update(files_after=int(_detail(spark, policy, root).numFiles),
               files_added=int(metrics.numFilesAdded), files_removed=int(metrics.numFilesRemoved),
               version=_version(spark, policy, root), retries=retries)
    log.info("optimize %s: %d -> %d files%s, %d retries", name, before, out["files_after"],
             " (Z-order window_start)" if policy.zorder else "", retries)
    return out


def vacuum(spark, name: str, params: Any = None, root: str | Path | None = None,
           now: dt.datetime | None = None) -> dict[str, Any]:
    """Delete the files the table stopped using more than the retention ago."""
    policy, out = _begin(spark, "vacuum", name, root, "no_vacuum")
    if "skipped" in out:
        return out
    params = MaintenanceParams.parse(params)
    hours = params.vacuum_retention_hours
    floor = interval_hours((_detail(spark, policy, root).properties or {})
                           .get("delta.deletedFileRetentionDuration"))
    if hours < floor and not params.vacuum_below_safety_check:
        raise MaintenanceParamError(f"vacuum_retention_hours {hours} is below {name}'s delta."
                                    f"deletedFileRetentionDuration ({floor:g} h): set "
                                    "vacuum_below_safety_check to go below it")
    # Delta 4.4 ignores RETAIN unless told otherwise; below the floor its check must be off.
    confs = {RETENTION_WINDOW_IGNORE: "false",
             LISTING_PARALLELISM: spark.conf.get("spark.sql.shuffle.partitions")}
    if hours < floor:
        confs[RETENTION_CHECK] = "false"
    path = policy.table.path(root)
    out.update(retention_hours=hours, time_travel_hours=min(hours, floor),
               files_on_disk_before=_files_on_disk(path))
    first = _version(spark, policy, root) + 1

    def run() -> None:
        with _annotated(spark, "vacuum", policy, confs, retention_hours=hours):
            spark.sql(f"VACUUM {_sql(policy, root)} RETAIN {hours} HOURS").collect()

    _, retries = _retrying(f"vacuum {name}", run)
    ends = [c for c in delta_rs.history(path, 20)
            if c.version >= first and c.operation == "VACUUM END"]
    deleted = ends[0].metrics.get("numDeletedFiles") if ends else None
    out.update(files_on_disk_after=_files_on_disk(path),
               files_deleted=None if deleted is None else int(deleted),
               version=_version(spark, policy, root), retries=retries)
    log.info("vacuum %s: %s file(s) deleted (retention %d h)", name, out["files_deleted"], hours)
    return out


def checkpoint(spark, name: str, params: Any = None, root: str | Path | None = None,
               now: dt.datetime | None = None) -> dict[str, Any]:
    """Checkpoint the table's Delta log at its latest version (unless one exists)."""
    policy, out = _begin(spark, "checkpoint", name, root)
    if "skipped" in out:
        return out
    path = policy.table.path(root)
    interval = int((_detail(spark, policy, root).properties or {})
                   .get("delta.checkpointInterval", 10))
    out.update(checkpoint_interval=interval, checkpoint_before=delta_rs.last_checkpoint(path))
    jspark = getattr(spark, "_jsparkSession", None)
    if jspark is None:  # Spark Connect: no JVM here; Delta checkpoints every `interval` commits
        return {**out, "mode": "automatic", "version": _version(spark, policy, root),
                "checkpoint_version": delta_rs.last_checkpoint(path),
                "log_entries": _log_entries(path)}
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(jspark, path)
    snapshot = delta_log.update(False, none, none)
    version = int(snapshot.version())
    written = not delta_log.checkpointExistsAtVersion(version)
    if written:
        delta_log.checkpoint(snapshot, none)
    out.update(mode="explicit", version=version, checkpoint_version=version, written=written,
               log_entries=_log_entries(path))
    log.info("checkpoint %s: version %d%s", name, version, "" if written else " (existed)")
    return out


STEPS: dict[str, Callable[..., dict[str, Any]]] = {
    "expire": expire, "optimize": optimize, "vacuum": vacuum, "checkpoint": checkpoint}


def run_step(spark, step: str, params: Any = None, root: str | Path | None = None,
             now: dt.datetime | None = None) -> dict[str, dict[str, Any]]:
    """One step over the params' tables: ``{table: figures}``. A table that fails does not
    stop the others; :class:`MaintenanceError` names every failure at the end."""
    if step not in STEPS:
        raise MaintenanceParamError(f"unknown step {step!r}; steps: {', '.join(STEPS)}")
    params = MaintenanceParams.parse(params)
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for name in params.tables:
        try:
            results[name] = STEPS[step](spark, name, params, root=root, now=now)
        except MaintenanceParamError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported below, after the other tables
            log.exception("%s %s failed", step, name)
            failed[name] = tables.spark_message(exc)
    if failed:
        raise MaintenanceError(f"{step} failed on {len(failed)} table(s): "
                               + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return results


def run_all(spark, params: Any = None, root: str | Path | None = None,
            now: dt.datetime | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every step in order (expire, optimize, vacuum, checkpoint): ``{step: {table: ...}}``."""
    params = MaintenanceParams.parse(params)
    return {step: run_step(spark, step, params, root, now) for step in STEPS}
