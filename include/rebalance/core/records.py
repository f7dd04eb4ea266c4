"""Plan records of the control plane, without Spark: statuses, ids, time and JSON helpers.

A plan's life cycle (:class:`PlanStatus`), the row of the ``plans`` table as a Python
object (:class:`PlanRecord`), the columns of a plan's assignment frame
(:data:`FRAME_COLUMNS`), and the helpers every control-plane write uses (:func:`utcnow`,
:func:`as_utc`, :func:`to_json`, :func:`commit_metadata`). The Delta side (tables,
transactions, leases) is :mod:`rebalance.spark.plan_store`; this module imports neither
Spark nor Airflow, so the DAG files, the CLI and unit tests can use it at no cost.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd

#: Lease held while a plan changes the live assignment.
APPLY_LEASE = "apply"


class PlanStatus(str, Enum):
    """Life cycle of a plan. Terminal: rejected, what-if, verified, diverged."""

    PROPOSED = "proposed"      # computed and stored, not yet checked
    VALIDATED = "validated"    # passed the Great Expectations gate
    REJECTED = "rejected"      # failed the gate (reasons stored); never applied
    WHAT_IF = "what-if"        # backfill or dry-run: stored for analysis, never applied
    PUBLISHED = "published"    # stored and cleared for apply (after approval, if required)
    APPLIED = "applied"        # its routing table is the live assignment version
    VERIFIED = "verified"      # realised imbalance matched the prediction
    DIVERGED = "diverged"      # realised imbalance did not match the prediction


#: Delta ``txnVersion`` of each status: writing a status at or below the recorded
#: one is a retry, and Delta skips it.
STATUS_ORDER = {
    PlanStatus.PROPOSED: 1,
    PlanStatus.VALIDATED: 2,
    PlanStatus.REJECTED: 2,
    PlanStatus.WHAT_IF: 3,
    PlanStatus.PUBLISHED: 3,
    PlanStatus.APPLIED: 4,
    PlanStatus.VERIFIED: 5,
    PlanStatus.DIVERGED: 5,
}
#: Statuses of plans whose assignment version became live at some point.
LIVE_STATUSES = (PlanStatus.APPLIED.value, PlanStatus.VERIFIED.value, PlanStatus.DIVERGED.value)

#: Columns of a plan's assignment frame (stored in ``plan_assignments``, checked by
#: :mod:`rebalance.control.validation`); :func:`rebalance.control.inputs.assignment_frame` builds it.
FRAME_COLUMNS = ("key", "instance", "current", "default", "load", "state", "moved")
#: Optional column of an assignment frame: a split key's instances and shares as JSON text
#: (``{"0": 0.5, "3": 0.5}``, :func:`split_text`), NULL for a whole key, whose ``instance``
#: is then its largest share's and ``moved`` true only when no share stays on ``current``.
SPLIT_COLUMN = "split"
_JSON_FIELDS = ("reasons", "params", "metrics", "inputs", "validation", "verification")




class PlanStoreError(RuntimeError):
    """A control-plane operation cannot proceed (unknown plan, lease held)."""


def utcnow() -> dt.datetime:
    """Now in UTC, to the second (what the tables store)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def as_utc(value: Any) -> dt.datetime | None:
    """A datetime (or ISO string / pandas Timestamp) as an aware UTC datetime.

    Spark returns TIMESTAMP values as naive datetimes in the Python process's local
    time; the project runs in UTC (session time zone and workers), so naive means UTC.
    """
    if value is None or (not isinstance(value, (str, dt.datetime)) and pd.isna(value)):
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    value = (value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None
             else value.astimezone(dt.timezone.utc))
    # A plain datetime (not a pendulum/pandas subclass): Spark accepts only those.
    return dt.datetime(value.year, value.month, value.day, value.hour, value.minute,
                       value.second, value.microsecond, tzinfo=dt.timezone.utc)


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(value: Any) -> str:
    """Sorted, compact JSON (datetimes as ISO strings, numpy scalars as numbers)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def hash_id(payload: Any) -> str:
    """The 20 hex digits of the SHA-256 of ``payload``'s :func:`to_json`: every plan id."""
    return hashlib.sha256(to_json(payload).encode()).hexdigest()[:20]


def commit_metadata(**values: Any) -> str:
    """``userMetadata`` of a Delta commit: the non-None values as sorted JSON."""
    return to_json({k: v for k, v in values.items() if v is not None})


@dataclass
class PlanRecord:
    """One row of the ``plans`` table; JSON columns are plain dicts here."""

    plan_id: str
    status: str
    method: str
    dag_id: str
    run_id: str
    run_type: str
    data_interval_start: dt.datetime | None = None
    data_interval_end: dt.datetime | None = None
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    apply_mode: str | None = None
    reasons: list[str] = field(default_factory=list)
    validation: dict[str, Any] = field(default_factory=dict)
    verification: dict[str, Any] = field(default_factory=dict)
    base_assignment_version: int | None = None
    assignment_version: int | None = None
    predicted_imbalance: float | None = None
    realised_imbalance: float | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        for name in _JSON_FIELDS:
            row[name] = to_json(row[name])
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PlanRecord:
        values = {f.name: row.get(f.name) for f in fields(cls)}
        for name in _JSON_FIELDS:
            values[name] = json.loads(values[name]) if values[name] else None
            if values[name] is None:
                values[name] = [] if name == "reasons" else {}
        for name in ("base_assignment_version", "assignment_version"):
            values[name] = None if _missing(values[name]) else int(values[name])
        for name in ("predicted_imbalance", "realised_imbalance"):
            values[name] = None if _missing(values[name]) else float(values[name])
        for name in ("data_interval_start", "data_interval_end", "created_at", "updated_at"):
            values[name] = as_utc(values[name])
        return cls(**values)

    @property
    def backtest(self) -> dict[str, Any]:
        """How the plan was made and judged before it was stored (``inputs["backtest"]``,
        written by :func:`rebalance.control.tasks.plan`): load model, ``theta_plan``, the
        mean realised imbalance of the plan and of staying on the held-out windows, and
        why. Empty for plans made before it existed and for rollbacks."""
        return dict(self.inputs.get("backtest") or {})

    @property
    def applied_at(self) -> dt.datetime | None:
        """When its assignment version went live (None if it never did)."""
        return as_utc(self.verification.get("applied_at"))

    def summary(self) -> dict[str, Any]:
        """The small dict Airflow tasks pass on (XCom)."""
        return {
            "plan_id": self.plan_id,
            "status": self.status,
            "method": self.method,
            "apply_mode": self.apply_mode,
            "base_assignment_version": self.base_assignment_version,
            "assignment_version": self.assignment_version,
            "imbalance_before": self.metrics.get("imbalance_before"),
            "predicted_imbalance": self.predicted_imbalance,
            "realised_imbalance": self.realised_imbalance,
            "backtested_imbalance": self.backtest.get("planned"),
            "theta": self.params.get("theta"),
            "theta_plan": self.backtest.get("theta_plan"),
            "load_model": self.backtest.get("load_model"),
            "migration_fraction": self.metrics.get("migration_fraction"),
            "moved_keys": self.metrics.get("moved_keys"),
            "reasons": list(self.reasons),
        }

    def commit_values(self) -> dict[str, Any]:
        """What every commit about this plan records in ``userMetadata``."""
        keep = ("imbalance_before", "imbalance_after", "migration_bytes", "migration_fraction",
                "moved_keys", "table_size", "n_keys", "n_instances")
        values = {
            "plan_id": self.plan_id,
            "status": self.status,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "run_type": self.run_type,
            "method": self.method,
            "apply_mode": self.apply_mode,
            "metrics": {k: self.metrics[k] for k in keep if k in self.metrics} or None,
            "base_assignment_version": self.base_assignment_version,
            "assignment_version": self.assignment_version,
            "rollback_to": self.inputs.get("rollback_to"),
        }
        return {k: v for k, v in values.items() if v is not None}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def split_text(parts: Mapping[int, float]) -> str:
    """A split key's ``{instance: share}`` as the :data:`SPLIT_COLUMN` text."""
    return json.dumps({str(int(i)): float(parts[i]) for i in sorted(parts)})


def frame_splits(frame: pd.DataFrame) -> dict[str, dict[int, float]]:
    """The split keys of an assignment frame: key -> {instance: share} (empty without the
    :data:`SPLIT_COLUMN` or with only whole keys). Raises ValueError on a malformed text."""
    if SPLIT_COLUMN not in frame.columns:
        return {}
    out: dict[str, dict[int, float]] = {}
    present = frame[SPLIT_COLUMN].notna().to_numpy()
    for key, text in zip(frame["key"].to_numpy()[present], frame[SPLIT_COLUMN].to_numpy()[present]):
        try:
            parts = json.loads(text)
            out[str(key)] = {int(i): float(share) for i, share in parts.items()}
        except (TypeError, ValueError, AttributeError):
            raise ValueError(f"split of key {key!r} is not a JSON object of instance -> share: "
                             f"{str(text)[:80]!r}") from None
    return out


def moved_mask(keys, instance, current, splits: Mapping[str, Mapping[int, float]] | None = None
               ) -> np.ndarray:
    """Keys whose state migrates: a whole key off its ``current`` instance; a split key
    (``splits``: key -> {instance: share}) only when none of its shares is ``current``."""
    current = np.asarray(current)
    moved = np.asarray(instance) != current
    if splits:
        keys = pd.Series(np.asarray(keys)).astype(str)
        for i in np.flatnonzero(keys.isin(list(splits)).to_numpy()):
            moved[i] = int(current[i]) not in splits[keys.iat[i]]
    return moved


def frame_loads(frame: pd.DataFrame, n_instances: int, column: str = "instance",
                splits: Mapping[str, Mapping[int, float]] | None = None) -> list[float]:
    """Load per instance of an assignment frame under ``column`` (``instance``: the plan;
    ``current``: before it). A split key loads each of its instances by its share under
    ``instance``; instances outside ``[0, N)`` are left out. ``splits``: the frame's, when
    the caller parsed them already."""
    if column != "instance":
        splits = {}
    elif splits is None:
        splits = frame_splits(frame)
    where = frame[column].to_numpy()
    load = frame["load"].to_numpy(dtype=float)
    whole = (where >= 0) & (where < n_instances)
    if splits:
        whole &= ~frame["key"].astype(str).isin(list(splits)).to_numpy()
    loads = [float(x) for x in np.bincount(where[whole].astype(np.int64), weights=load[whole],
                                           minlength=n_instances)[:n_instances]]
    if splits:
        key_load = dict(zip(frame["key"].astype(str), load))
        for key, parts in splits.items():
            for instance, share in parts.items():
                if 0 <= instance < n_instances:
                    loads[instance] += share * float(key_load[key])
    return loads
