"""Data-quality gate for plans, with Great Expectations 1.x.

A plan is checked as data before it may be published or applied:

* per key (the assignment frame: key, instance, current, default, load, state,
  moved): every key exactly once, no nulls, instances in [0, N), none on a
  drained instance, ``moved`` consistent with ``instance != current``, the
  expected number of keys;
* per plan (one row of reported and recomputed metrics): predicted imbalance
  <= 1 + theta, migration within the budget, table size within the bound, and
  every reported metric equal to the one recomputed from the assignment
  itself, so a corrupted or tampered plan cannot pass on its own word;
* split keys only for a job that records it merges their partial results.

Pure pandas + GX: no Spark, no Airflow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from rebalance.core.records import (
    FRAME_COLUMNS,
    SPLIT_COLUMN,
    frame_loads,
    frame_splits,
    moved_mask,
)

ASSIGNMENT_COLUMNS = FRAME_COLUMNS
_ROUND = 9  # digits compared when checking reported against recomputed metrics


@dataclass(frozen=True)
class PlanLimits:
    """The bounds a plan must meet (the parameters it was planned with)."""

    n_instances: int
    theta: float
    expected_keys: int
    max_table: int | None = None
    budget_bytes: float | None = None
    budget_keys: int | None = None
    drain: tuple[int, ...] = ()
    #: Why the job cannot take split keys (:func:`rebalance.spark.jobs.split_refusal`;
    #: None: it can, or nothing is recorded).
    splits_refused: str | None = None


@dataclass
class ValidationResult:
    success: bool
    failures: list[str] = field(default_factory=list)
    statistics: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        if self.success:
            return f"plan valid ({self.statistics.get('evaluated_expectations', 0)} expectations)"
        return "plan rejected: " + "; ".join(self.failures)


def recompute_metrics_independently(frame: pd.DataFrame, n_instances: int, drain=(),
                      splits: dict[str, dict[int, float]] | None = None) -> dict[str, float]:
    """Metrics of the assignment frame, from its columns alone. A split key
    (:data:`~rebalance.core.records.SPLIT_COLUMN`; ``splits``: the frame's, parsed by the
    caller) loads each of its instances by its share, is moved only when none of them is
    its current instance (:func:`~rebalance.core.records.moved_mask`), and takes one
    routing-table entry per share.

    Independently of the planner's code on purpose: the imbalance is computed here, not by
    :func:`rebalance.core.model.imbalance` (what computed the reported figure), so a fault
    in that one definition cannot make a plan agree with itself."""
    load = frame["load"].to_numpy(dtype=np.float64)
    state = frame["state"].to_numpy(dtype=np.float64)
    inst = frame["instance"].to_numpy()
    splits = frame_splits(frame) if splits is None else splits
    keys = frame["key"].astype(str)
    split = keys.isin(list(splits)).to_numpy()
    splits = {k: splits[k] for k in keys[split]}   # the rows given only
    loads = np.asarray(frame_loads(frame, n_instances, splits=splits))
    moved = moved_mask(keys, inst, frame["current"], splits)
    entries = int((inst[~split] != frame["default"].to_numpy()[~split]).sum())
    entries += sum(len(parts) for parts in splits.values())
    active = n_instances - len(set(drain))
    total = float(load.sum())
    total_state = float(state.sum())
    return {
        "imbalance_after": float(loads.max()) / (total / active) if total > 0 else 1.0,
        "migration_bytes": float(state[moved].sum()),
        "migration_fraction": float(state[moved].sum()) / total_state if total_state > 0 else 0.0,
        "moved_keys": int(moved.sum()),
        "table_size": entries,
    }


def split_failures(frame: pd.DataFrame, n_instances: int, drain=()) -> list[str]:
    """What is wrong with the split keys of a frame: the shares (at least two instances
    in ``[0, N)``, each > 0, summing to 1), a key's ``instance`` not among its shares, a
    share on a drained instance."""
    return _split_checks(frame, n_instances, drain)[0]


def _split_checks(frame: pd.DataFrame, n_instances: int, drain=()
                  ) -> tuple[list[str], dict[str, dict[int, float]]]:
    """(:func:`split_failures`, the frame's splits: empty when they cannot be read)."""
    from rebalance.core.assignment import AssignmentError, validate_splits

    try:
        splits = frame_splits(frame)
        validate_splits(splits, n_instances)
    except (ValueError, AssignmentError) as exc:
        return [str(exc)], {}
    return _share_failures(frame, splits, drain), splits


def _share_failures(frame: pd.DataFrame, splits: dict[str, dict[int, float]], drain=()
                    ) -> list[str]:
    out: list[str] = []
    if not splits:      # a plan of whole keys: nothing more to read
        return out
    rows = frame[frame["key"].astype(str).isin(list(splits))]
    instance = dict(zip(rows["key"].astype(str), rows["instance"]))
    for key, parts in splits.items():
        if int(instance[key]) not in parts:
            out.append(f"split key {key!r}: its instance {instance[key]} is not one of its "
                       f"shares {sorted(parts)}")
        if set(parts) & set(drain):
            out.append(f"split key {key!r} keeps shares on drained instances "
                       f"{sorted(set(parts) & set(drain))}")
    return out


@lru_cache(maxsize=1)
def _context():
    # GX logs its plugin registry at INFO on first use: hundreds of lines per task log.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = ctx.data_sources.add_pandas("plans")
    return ctx, {
        name: source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("all")
        for name in ("assignment", "plan_metrics")
    }


def _run(asset: str, suite_name: str, expectations: list, frame: pd.DataFrame):
    import great_expectations as gx

    ctx, batches = _context()
    try:
        ctx.suites.delete(suite_name)
    except Exception:  # noqa: BLE001 - absent suite: nothing to delete
        pass
    suite = ctx.suites.add(gx.ExpectationSuite(name=suite_name, expectations=expectations))
    return batches[asset].get_batch(batch_parameters={"dataframe": frame}).validate(suite)


def _assignment_expectations(limits: PlanLimits) -> list:
    import great_expectations.expectations as gxe

    exps = [gxe.ExpectTableRowCountToEqual(value=limits.expected_keys)]
    exps += [gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ASSIGNMENT_COLUMNS]
    exps += [
        gxe.ExpectColumnValuesToBeUnique(column="key"),
        gxe.ExpectColumnValuesToBeBetween(column="instance", min_value=0,
                                          max_value=limits.n_instances - 1),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="moved", column_B="moved_recomputed"),
    ]
    if limits.drain:
        exps.append(gxe.ExpectColumnValuesToNotBeInSet(column="instance",
                                                       value_set=list(limits.drain)))
    return exps


def _metric_expectations(limits: PlanLimits) -> list:
    import great_expectations.expectations as gxe

    exps = [
        gxe.ExpectColumnValuesToBeBetween(column="imbalance_after", min_value=0,
                                          max_value=round(1.0 + limits.theta, _ROUND)),
    ]
    if limits.max_table is not None:
        exps.append(gxe.ExpectColumnValuesToBeBetween(column="table_size", min_value=0,
                                                      max_value=limits.max_table))
    if limits.budget_bytes is not None:
        exps.append(gxe.ExpectColumnValuesToBeBetween(column="migration_bytes", min_value=0,
                                                      max_value=limits.budget_bytes))
    if limits.budget_keys is not None:
        exps.append(gxe.ExpectColumnValuesToBeBetween(column="moved_keys", min_value=0,
                                                      max_value=limits.budget_keys))
    for name in ("imbalance_after", "migration_bytes", "moved_keys", "table_size"):
        exps.append(gxe.ExpectColumnPairValuesToBeEqual(
            column_A=name, column_B=f"{name}_recomputed"))
    return exps


def expectation_results(suite: str, result) -> list[dict[str, Any]]:
    """Every expectation of a GX validation result: suite, type, arguments, success and
    what was seen (stored with the plan, shown by the Rebalance view)."""
    out = []
    for r in result.results:
        cfg = r.expectation_config
        detail = r.result or {}
        seen = detail.get("partial_unexpected_list") or detail.get("observed_value")
        out.append({
            "suite": suite, "expectation": cfg.type, "success": bool(r.success),
            "kwargs": {k: v for k, v in cfg.kwargs.items() if k != "batch_id"},
            "unexpected_count": detail.get("unexpected_count"),
            "seen": seen[:5] if isinstance(seen, list) else seen,
        })
    return out


def _describe(result) -> list[str]:
    out = []
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        kwargs = {k: v for k, v in cfg.kwargs.items() if k != "batch_id"}
        detail = r.result or {}
        seen = detail.get("partial_unexpected_list") or detail.get("observed_value")
        count = detail.get("unexpected_count")
        where = f" ({count} unexpected, e.g. {seen[:5] if isinstance(seen, list) else seen})" \
            if count else (f" (observed {seen})" if seen is not None else "")
        out.append(f"{cfg.type} {kwargs}{where}")
    return out


def validate_plan(frame: pd.DataFrame, metrics: dict[str, Any], limits: PlanLimits) -> ValidationResult:
    """Validate an assignment frame and its reported metrics against the limits."""
    missing = [c for c in ASSIGNMENT_COLUMNS if c not in frame.columns]
    if missing:
        return ValidationResult(False, [f"assignment frame lacks columns {missing}"])
    failures, splits = _split_checks(frame, limits.n_instances, limits.drain)
    if splits and limits.splits_refused:
        failures.append(f"the plan splits {len(splits)} key(s), but {limits.splits_refused}")
    if failures:
        return ValidationResult(False, failures)
    columns = [*ASSIGNMENT_COLUMNS, *([SPLIT_COLUMN] if SPLIT_COLUMN in frame.columns else [])]
    frame = frame.loc[:, columns].copy()
    frame["moved_recomputed"] = moved_mask(frame["key"], frame["instance"], frame["current"],
                                           splits)
    recomputed = recompute_metrics_independently(
        frame.dropna(subset=list(ASSIGNMENT_COLUMNS)), limits.n_instances, limits.drain, splits)
    row: dict[str, Any] = {}
    for name, value in recomputed.items():
        reported = metrics.get(name)
        row[name] = round(float(reported), _ROUND) if reported is not None else np.nan
        row[f"{name}_recomputed"] = round(float(value), _ROUND)
    plan_row = pd.DataFrame([row])
    results = [
        _run("assignment", "plan_assignment", _assignment_expectations(limits), frame),
        _run("plan_metrics", "plan_metrics", _metric_expectations(limits), plan_row),
    ]
    stats = {"evaluated_expectations": sum(r.statistics["evaluated_expectations"] for r in results),
             "unsuccessful_expectations": sum(r.statistics["unsuccessful_expectations"]
                                              for r in results)}
    stats["expectations"] = [e for suite, r in zip(("assignment", "plan_metrics"), results)
                             for e in expectation_results(suite, r)]
    failures = [f for r in results for f in _describe(r)]
    return ValidationResult(not failures, failures, stats)
