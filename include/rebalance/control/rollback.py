"""Rollback plans: restoring an earlier assignment version through the path every plan takes.

:func:`propose_rollback` stores the plan (method ``rollback``) whose assignment is the
routing table of the version to restore; the ``rebalance_rollback`` DAG and
``rebalance rollback`` then validate, publish and apply it like any plan
(:mod:`rebalance.control.tasks`, :mod:`rebalance.control.rollout`), under the same lease,
as a *new* assignment version.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rebalance.control.inputs import assignment_frame, plan_store
from rebalance.control.params import RunInfo, RunParams
from rebalance.control.validation import recompute_metrics_independently
from rebalance.core.model import Problem, evaluate
from rebalance.core.placement import default_instances
from rebalance.core.records import PlanRecord, PlanStatus, as_utc, hash_id

#: The run identity of rollbacks stored from the command line.
ROLLBACK_DAG_ID = "rebalance-cli"


def propose_rollback(spark, to_version: int, theta: float | None = None,
                     lookback_windows: int = 6, dry_run: bool = False) -> dict[str, Any]:
    """Store the plan that restores ``to_version``: returns the payload for validate/publish/apply.

    The plan's frame covers every key of the live and the restored routing tables and of
    the latest windows; loads and state come from the latest ``lookback_windows`` windows
    (zero for keys without traffic). Idempotent: the plan id is a hash of the target, the
    live version and the histogram version, so a repeated command finds the stored plan.
    """
    from rebalance.spark import tables

    if not tables.exists(spark, tables.ASSIGNMENTS):
        raise LookupError("no assignments table: nothing was ever published")
    live_version = tables.latest_assignment_version(spark)
    if to_version == live_version:
        raise ValueError(f"assignment version {to_version} is already live")
    if not 0 <= to_version < live_version:
        raise LookupError(f"assignment version {to_version} does not exist (live: v{live_version})")
    try:
        target = tables.read_assignment(spark, version=to_version)
    except tables.AssignmentError as exc:
        raise LookupError(str(exc)) from None
    live = tables.read_assignment(spark)
    if (live.routing, live.splits) == (target.routing, target.splits):
        raise ValueError(f"the live assignment v{live_version} already routes exactly as "
                         f"v{to_version}: nothing to restore")
    n = live.n_instances
    loads, states, windows, hist_version = latest_loads(spark, lookback_windows)
    keys = np.array(sorted(set(live.routing) | set(target.routing) | set(loads)), dtype=object)
    default = default_instances(keys, n)
    current = np.array([live.routing.get(k, d) for k, d in zip(keys, default)], dtype=np.int64)
    restored = np.array([target.routing.get(k, d) for k, d in zip(keys, default)], dtype=np.int64)
    problem = Problem(keys=keys, load=np.array([loads.get(k, 0.0) for k in keys]),
                      state=np.array([states.get(k, 0.0) for k in keys]), current=current,
                      default=default, n_instances=n)
    frame = assignment_frame(problem, restored, target.splits)
    # the gate's own arithmetic: a split key loads its instances by share
    metrics = {**evaluate(problem, restored).to_dict(),
               **recompute_metrics_independently(frame, n)}
    bound = theta if theta is not None else max(0.1, metrics["imbalance_after"] - 1 + 1e-6)
    mode = "dry-run" if dry_run else "auto"
    params = RunParams(theta=bound, max_table=None, migration_budget=None,
                       apply_mode="auto" if not dry_run else "dry-run", force=True)
    run = RunInfo(ROLLBACK_DAG_ID, f"rollback-to-v{to_version}-from-v{live_version}",
                  "rollback", None, None)
    inputs = {"windows": windows, "key_histograms_version": hist_version,
              "base_assignment_version": live_version, "n_instances": n,
              "n_keys": int(len(keys)), "total_state": float(problem.state.sum()),
              "events": 0, "rollback_to": int(to_version)}
    plan_id = hash_id({"rollback_to": to_version, "live": live_version,
                       "histograms": hist_version, "theta": bound, "mode": mode})
    store = plan_store(spark)
    record = store.get(plan_id)
    if record is None:
        record = store.propose(PlanRecord(
            plan_id=plan_id, status=PlanStatus.PROPOSED.value, method="rollback",
            dag_id=run.dag_id, run_id=run.run_id, run_type=run.run_type,
            params=params.to_dict(), metrics=metrics, inputs=inputs, apply_mode=mode,
            reasons=[f"rollback to assignment version {to_version}"],
            base_assignment_version=live_version,
            predicted_imbalance=float(metrics["imbalance_after"])), frame)
    return {"run": run.to_dict(), "params": params.to_dict(), "inputs": inputs,
            "plan": record.summary()}


def latest_loads(spark, lookback: int) -> tuple[dict[str, float], dict[str, float], list[str],
                                                 int | None]:
    """Per-key load and state of the latest ``lookback`` windows, if any: the histogram rows
    through :func:`rebalance.core.histograms.build_problem` (load = cost per window, mean over
    the windows; state = bytes at the close of the key's latest window), as every plan."""
    from rebalance.core.histograms import build_problem
    from rebalance.spark import tables
    from rebalance.spark.loads import histogram_rows, newest_windows

    if not tables.exists(spark, tables.KEY_HISTOGRAMS):
        return {}, {}, [], None
    version = tables.history(spark, tables.KEY_HISTOGRAMS, limit=1)[0].version
    starts = newest_windows(spark, lookback, version=version)
    if not starts:
        return {}, {}, [], version
    pdf = histogram_rows(spark, starts, version=version)
    n = max(1, int(tables.assignments_n_instances(spark)))
    problem, _ = build_problem(pdf, n, None, windows=len(starts))
    keys = [str(k) for k in problem.keys]
    return (dict(zip(keys, problem.load.tolist())), dict(zip(keys, problem.state.tolist())),
            sorted(as_utc(s).isoformat() for s in starts), version)
