"""Delta tables of the control plane: plans, their assignment frames, and leases.

``plans`` (one row per plan and its status), ``plan_assignments`` (each plan's assignment
frame, written once) and ``control`` (named leases) are declared like the job's tables of
:mod:`rebalance.spark.tables`. Every write about a plan is an idempotent Delta transaction
(``txnAppId`` = plan id, ``txnVersion`` growing with :data:`STATUS_ORDER`) and carries
``userMetadata``: the Delta history is the audit log (:mod:`rebalance.cli.audit`). Columns,
idempotency and the write engines: ``docs/dag.md``, "Tables".

>>> store = PlanStore(get_spark())                                    # doctest: +SKIP
>>> store.get("3f2a9c...").status                                     # doctest: +SKIP
'verified'
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from rebalance.core.records import (
    APPLY_LEASE,
    FRAME_COLUMNS,
    LIVE_STATUSES,
    SPLIT_COLUMN,
    STATUS_ORDER,
    PlanRecord,
    PlanStatus,
    PlanStoreError,
    as_utc,
    commit_metadata,
    utcnow,
)
from rebalance.spark import delta_rs, tables
from rebalance.spark.tables import Table

log = logging.getLogger(__name__)

PLANS = Table(
    "plans",
    "plan_id STRING, status STRING, reasons STRING, method STRING, apply_mode STRING, "
    "dag_id STRING, run_id STRING, run_type STRING, data_interval_start TIMESTAMP, "
    "data_interval_end TIMESTAMP, params STRING, metrics STRING, inputs STRING, "
    "validation STRING, verification STRING, base_assignment_version BIGINT, "
    "assignment_version BIGINT, predicted_imbalance DOUBLE, realised_imbalance DOUBLE, "
    "created_at TIMESTAMP, updated_at TIMESTAMP",
    "One row per plan (status, reasons, params, metrics, inputs, validation, verification as "
    "JSON); every change is one commit whose userMetadata names the action and the plan.")
PLAN_ASSIGNMENTS = Table(
    "plan_assignments",
    "plan_id STRING, key STRING, instance INT, current INT, default INT, load DOUBLE, "
    "state DOUBLE, moved BOOLEAN, split STRING",
    "The assignment frame of every plan, as validated; written once per plan. split: a split "
    "key's instances and shares as JSON ({\"instance\": share}), NULL for a whole key.")
CONTROL = Table(
    "control", "name STRING, holder STRING, acquired_at TIMESTAMP, expires_at TIMESTAMP",
    "Named leases of the control plane (apply: who may change the live assignment).")


# Spark session confs are session-wide: one annotated Delta DML at a time.
_TXN_LOCK = threading.RLock()


@contextmanager
def delta_txn(spark, app_id: str | None, version: int | None, metadata: str | None) -> Iterator[None]:
    """Make the Delta DML (MERGE/UPDATE/DELETE) run inside the block idempotent and annotated.

    Sets ``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` (Delta skips the
    commit when this application id already committed this version or a later one)
    and ``spark.databricks.delta.commitInfo.userMetadata``, and unsets them afterwards.
    DataFrame writes take the same values as writer options instead.
    """
    confs = {
        "spark.databricks.delta.write.txnAppId": app_id,
        "spark.databricks.delta.write.txnVersion": None if version is None else str(version),
        "spark.databricks.delta.commitInfo.userMetadata": metadata,
    }
    with _TXN_LOCK:
        try:
            for key, value in confs.items():
                if value is not None:
                    spark.conf.set(key, value)
            yield
        finally:
            for key in confs:
                spark.conf.unset(key)


#: An UPDATE of ``plans`` that loses Delta's optimistic-concurrency check to another
#: run's commit (two runs at once) is re-read and retried, with back-off, this many times.
CONFLICT_RETRIES = 4
CONFLICT_BACKOFF_SECONDS = 0.5


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Delta's concurrent-commit conflicts (Spark classic or
    Connect, or delta-rs)."""
    text = f"{type(exc).__name__} {str(exc)[:500]}"
    return "Concurrent" in text or ("CommitFailed" in text and "concurrent" in text)


def _created(record: PlanRecord) -> dt.datetime:
    return record.created_at or dt.datetime.min.replace(tzinfo=dt.timezone.utc)


class PlanStore:
    """Plans, their assignment frames, and leases, under one tables root."""

    def __init__(self, spark, root: str | Path | None = None) -> None:
        self.spark = spark
        self.root = root
        self._ready: set[str] = set()
        self._local: dict[str, bool] = {}

    # ----------------------------------------------------------------- tables
    def path(self, table: Table = PLANS) -> str:
        return table.path(self.root)

    def ensure(self, table: Table) -> None:
        """Create the Delta table on first use (the control table with its lease rows), or
        add the columns declared since it was created."""
        if table.name not in self._ready:
            existed = tables.exists(self.spark, table, self.root)
            tables.ensure_table(self.spark, table, self.root)
            if not existed and table is CONTROL:
                self._add_leases([APPLY_LEASE])
            self._ready.add(table.name)

    def _local_writes(self, table: Table) -> bool:
        """Whether this table's writes go through delta-rs (checked once per table)."""
        if table.name not in self._local:
            self._local[table.name] = delta_rs.writable(self.path(table))
        return self._local[table.name]

    def _update(self, table: Table, where: Callable[[Callable[[Any, str], str]], str],
                values: dict[str, Any], metadata: str,
                txn: tuple[str, int] | None = None) -> int | None:
        """One UPDATE of ``table``, annotated with ``metadata`` and idempotent with ``txn``;
        the rows it updated. ``where(literal)`` writes the condition with the engine's
        ``literal(value, sql_type)`` (the SQL dialects quote strings and timestamps
        differently)."""
        if self._local_writes(table):
            return delta_rs.update(self.path(table), where(delta_rs.sql_literal), values,
                                   table.schema_ddl, metadata=metadata, txn=txn)
        with delta_txn(self.spark, *(txn or (None, None)), metadata):
            return tables.update(self.spark, table, where(tables.sql_literal), values,
                                 self.root)

    def _append(self, table: Table, frame: pd.DataFrame, metadata: dict[str, Any],
                txn: tuple[str, int]) -> None:
        if self._local_writes(table):
            delta_rs.append(self.path(table), pa.Table.from_pandas(frame, preserve_index=False),
                            metadata=metadata, txn=txn)
        else:
            tables.append(self.spark.createDataFrame(frame, table.schema), table, self.root,
                          metadata=metadata, txn=txn)

    def _add_leases(self, names: list[str]) -> None:
        rows = [(name, None, None, None) for name in names]
        tables.append(self.spark.createDataFrame(rows, CONTROL.schema), CONTROL, self.root,
                      metadata={"action": "create-leases", "leases": names},
                      txn=(f"control:{','.join(names)}", 0))

    def rows(self, table: Table, filters: list[tuple] | None = None,
             columns: list[str] | None = None) -> list[dict[str, Any]]:
        """Rows of a table matching ``filters`` (:func:`rebalance.spark.tables.read_rows`:
        through delta-rs, no Spark job); empty when never written."""
        return tables.read_rows(self.spark, table, self.root, columns=columns, filters=filters)

    # ------------------------------------------------------------------ plans
    def get(self, plan_id: str) -> PlanRecord | None:
        """The plan with this id, or None."""
        rows = self.rows(PLANS, [("plan_id", "=", plan_id)])
        return PlanRecord.from_row(rows[0]) if rows else None

    def require(self, plan_id: str) -> PlanRecord:
        record = self.get(plan_id)
        if record is None:
            raise PlanStoreError(f"no plan {plan_id!r} in {self.path(PLANS)}")
        return record

    def find_for_run(self, dag_id: str, run_id: str) -> PlanRecord | None:
        """The plan a DAG run stored (its retries reuse its inputs), or None."""
        rows = self.rows(PLANS, [("dag_id", "=", dag_id), ("run_id", "=", run_id)])
        records = sorted((PlanRecord.from_row(r) for r in rows), key=_created)
        return records[0] if records else None

    def plans(self, statuses: tuple[str, ...] | None = None) -> list[PlanRecord]:
        """All plans, oldest first (optionally only some statuses)."""
        rows = self.rows(PLANS, [("status", "in", list(statuses))] if statuses else None)
        return sorted((PlanRecord.from_row(r) for r in rows),
                      key=lambda r: (_created(r), r.plan_id))

    def last_live_plan_before(self, when: dt.datetime, exclude_run: str | None = None) -> dt.datetime | None:
        """End of the data interval of the latest plan that went live, among those planned
        on data up to ``when`` (excluding one run's plans). Data-interval time, so the
        cooldown holds for backfills and replays too; a rollback (no interval) counts at
        the time it was applied."""
        # The detect task asks once per run: three columns of the live plans are read, not
        # every live plan's record (their inputs and metrics make the rows large).
        rows = self.rows(PLANS, [("status", "in", list(LIVE_STATUSES))],
                         ["run_id", "data_interval_end", "verification"])
        times = []
        for row in rows:
            if exclude_run is not None and row["run_id"] == exclude_run:
                continue
            end = as_utc(row["data_interval_end"])
            times.append(end if end is not None else
                         as_utc(json.loads(row["verification"] or "{}").get("applied_at")))
        times = [t for t in times if t is not None and t <= when]
        return max(times) if times else None

    def propose(self, record: PlanRecord, frame: pd.DataFrame) -> PlanRecord:
        """Store a new plan (status proposed) and its assignment frame: two appends.

        Both appends are idempotent on their own (``txnAppId`` = the plan id), so a
        retry, even after a crash between them, adds no duplicate version.
        """
        record.status = PlanStatus.PROPOSED.value
        record.created_at = record.updated_at = utcnow()
        meta = {"action": "propose", **record.commit_values()}
        self._write_frame(record.plan_id, frame, meta)
        self.ensure(PLANS)
        self._append(PLANS, pd.DataFrame([record.to_row()], columns=PLANS.columns), meta,
                     (record.plan_id, STATUS_ORDER[PlanStatus.PROPOSED]))
        return record

    def transition(self, plan_id: str, status: PlanStatus, *, action: str, **changes: Any) -> PlanRecord:
        """Move a plan to ``status`` with the given column changes: one UPDATE, one commit.

        Idempotent: when the plan already reached this status or a later one, the stored
        record is returned and nothing is written (Delta would skip the commit anyway:
        its ``txnVersion`` is not above the last one of this plan).
        """
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                return self._transition_once(plan_id, status, action, changes)
            except Exception as exc:  # noqa: BLE001 - only Delta's concurrent-commit conflicts
                if not is_conflict(exc) or attempt == CONFLICT_RETRIES:
                    raise
                log.info("plans: concurrent commit while moving %s to %s, retry %d",
                         plan_id, status.value, attempt + 1)
                time.sleep(CONFLICT_BACKOFF_SECONDS * 2 ** attempt)
        raise AssertionError("unreachable")

    def _transition_once(self, plan_id: str, status: PlanStatus, action: str,
                         changes: dict[str, Any]) -> PlanRecord:
        record = self.require(plan_id)
        if STATUS_ORDER[PlanStatus(record.status)] >= STATUS_ORDER[status]:
            return record
        for name, value in changes.items():
            if name not in PlanRecord.__dataclass_fields__:
                raise PlanStoreError(f"plans table has no column {name!r}")
            setattr(record, name, value)
        record.status = status.value
        record.updated_at = utcnow()
        row = record.to_row()
        values = {c: row[c] for c in ("status", "updated_at", *changes)}
        self.ensure(PLANS)
        self._update(PLANS, lambda lit: f"plan_id = {lit(plan_id, 'STRING')}", values,
                     commit_metadata(action=action, **record.commit_values()),
                     (plan_id, STATUS_ORDER[status]))
        return record

    # ------------------------------------------------------- assignment frames
    def _write_frame(self, plan_id: str, frame: pd.DataFrame, meta: dict[str, Any]) -> None:
        pdf = frame.loc[:, list(FRAME_COLUMNS)].copy()
        pdf.insert(0, "plan_id", plan_id)
        pdf["key"] = pdf["key"].astype(str)
        for c in ("instance", "current", "default"):
            pdf[c] = pdf[c].astype("int32")
        for c in ("load", "state"):
            pdf[c] = pdf[c].astype("float64")
        pdf["moved"] = pdf["moved"].astype(bool)
        pdf[SPLIT_COLUMN] = (frame[SPLIT_COLUMN].astype(object).where(
            frame[SPLIT_COLUMN].notna(), None) if SPLIT_COLUMN in frame else None)
        self.ensure(PLAN_ASSIGNMENTS)
        self._append(PLAN_ASSIGNMENTS, pdf, meta, (f"{plan_id}:frame", 1))

    def frame(self, plan_id: str) -> pd.DataFrame:
        """The stored assignment frame of a plan, sorted by key."""
        pdf = tables.read_pandas(self.spark, PLAN_ASSIGNMENTS, self.root,
                                 filters=[("plan_id", "=", plan_id)])
        if pdf is None:
            pdf = pd.DataFrame(columns=PLAN_ASSIGNMENTS.columns)
        pdf = pdf.drop(columns=["plan_id"])
        return pdf.sort_values("key", kind="stable").reset_index(drop=True)

    # ------------------------------------------------------------------ lease
    def acquire(self, name: str, holder: str, ttl_seconds: float) -> bool:
        """Take the named lease for ``holder`` unless someone else holds a live one.

        One conditional UPDATE of the lease row: Delta's optimistic concurrency makes
        two racing acquirers conflict, and the loser then reads the winner as holder.
        Re-acquiring one's own lease succeeds (retries). The UPDATE's count of rows
        updated says whether the lease was free; only after a conflict is it read back.
        """
        now = utcnow()
        def free(lit):
            return (f"name = {lit(name, 'STRING')} AND (holder IS NULL OR holder = "
                    f"{lit(holder, 'STRING')} OR expires_at < {lit(now, 'TIMESTAMP')})")

        self.ensure(CONTROL)
        updated = None
        try:
            updated = self._update(CONTROL, free, {
                "holder": holder, "acquired_at": now,
                "expires_at": now + dt.timedelta(seconds=ttl_seconds)},
                commit_metadata(action="acquire", lease=name, holder=holder))
        except Exception as exc:  # noqa: BLE001 - only Delta's concurrent-commit conflicts
            if not is_conflict(exc):
                raise
        if updated is not None:
            return updated > 0     # the one lease row was free (or ours) and is ours now
        return self.lease_holder(name) == holder

    def release(self, name: str, holder: str) -> None:
        """Give the lease back (only its holder can; no commit if not held)."""
        self.ensure(CONTROL)
        self._update(CONTROL, lambda lit: f"name = {lit(name, 'STRING')} AND holder = "
                                          f"{lit(holder, 'STRING')}",
                     {"holder": None, "expires_at": None},
                     commit_metadata(action="release", lease=name, holder=holder))

    def lease_holder(self, name: str) -> str | None:
        """Holder of the named lease while it is live, else None."""
        rows = self.rows(CONTROL, [("name", "=", name)])
        if not rows or rows[0]["holder"] is None:
            return None
        expires = as_utc(rows[0]["expires_at"])
        return rows[0]["holder"] if expires is not None and expires >= utcnow() else None

    @contextmanager
    def lease(self, name: str, holder: str, ttl_seconds: float = 900) -> Iterator[None]:
        """Hold the named lease for the block, or raise PlanStoreError naming the holder."""
        if not self.acquire(name, holder, ttl_seconds):
            raise PlanStoreError(
                f"lease {name!r} is held by {self.lease_holder(name)!r}: another run is "
                "changing the live assignment, and only one run applies at a time")
        try:
            yield
        finally:
            self.release(name, holder)

    def history(self, table: Table = PLANS) -> list[tables.Commit]:
        """Commits of a control-plane table, oldest first (empty when it does not exist)."""
        if not tables.exists(self.spark, table, self.root):
            return []
        return list(reversed(tables.history(self.spark, table, self.root)))
