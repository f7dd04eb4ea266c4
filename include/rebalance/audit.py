"""``rebalance history`` and ``rebalance rollback``: the audit trail, and undo.

The audit trail is Delta's own history: every commit of the ``plans`` table (one per
step of a plan: propose, validate or reject, publish or what-if, apply, verify) and of
the ``assignments`` table (one per assignment version) carries JSON ``userMetadata``
naming the action, the plan, the DAG run, the method and the metrics.

A rollback restores an earlier assignment version through the path every plan takes:
it is stored as a plan (method ``rollback``), checked by the same Great Expectations
gate, published and applied by :mod:`rebalance.pipeline` under the same lease, and
written as a *new* assignment version whose routing table equals the old one's.

    rebalance history [--limit 20] [--json]
    rebalance rollback --to-version 3 [--theta 0.5] [--dry-run]

cli.py registers both with :func:`add_subcommands`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

import numpy as np

ROLLBACK_DAG_ID = "rebalance-cli"


def add_subcommands(subparsers) -> None:
    """Add ``history`` and ``rollback`` to the ``rebalance`` command's subparsers."""
    h = subparsers.add_parser(
        "history", help="print the audit trail: plans and assignment versions from Delta history",
        description=history.__doc__)
    h.add_argument("--limit", type=int, default=20, help="latest N commits of each table (0: all)")
    h.add_argument("--json", action="store_true", help="print JSON instead of tables")
    h.set_defaults(func=history)

    r = subparsers.add_parser(
        "rollback", help="restore an earlier assignment version through the validated publish path",
        description=rollback.__doc__)
    r.add_argument("--to-version", type=int, required=True, metavar="V",
                   help="assignment version to restore (see `rebalance history`)")
    r.add_argument("--theta", type=float,
                   help="imbalance bound the restored assignment must meet on the latest "
                        "windows (default: none beyond its own predicted imbalance)")
    r.add_argument("--lookback-windows", type=int, default=6,
                   help="latest histogram windows whose loads and state the check uses")
    r.add_argument("--dry-run", action="store_true",
                   help="validate and store the rollback as a what-if plan, change nothing")
    r.set_defaults(func=rollback)


# -------------------------------------------------------------------- history
def history(args: argparse.Namespace) -> int:
    """Print the plans and assignment versions, newest first, from Delta history."""
    from .spark import tables
    from .spark.plan_store import PLANS, PlanStore

    from .cli import UserError
    from .pipeline import spark_session

    if args.limit < 0:  # checked before Spark starts (issue 14)
        raise UserError(f"--limit must be >= 0 (0: all), got {args.limit}")
    spark = spark_session()
    store = PlanStore(spark)
    limit = args.limit or None
    plan_commits = list(reversed(store.history(PLANS)))[:limit]
    versions = (tables.assignment_history(spark)[:limit]
                if tables.exists(spark, tables.ASSIGNMENTS) else [])
    live = tables.latest_assignment_version(spark) if versions else 0
    plans = {p.plan_id: p for p in store.plans()}
    if args.json:
        json.dump({
            "live_assignment_version": live,
            "assignment_versions": [_commit(c) for c in versions],
            "plan_commits": [_commit(c) for c in plan_commits],
            "plans": [p.summary() | {"run_id": p.run_id, "dag_id": p.dag_id,
                                     "created_at": p.created_at} for p in plans.values()],
        }, sys.stdout, indent=2, default=str)
        print()
        return 0
    print(f"Assignment versions ({tables.ASSIGNMENTS.path()}), live: v{live}")
    if not versions:
        print("  (none published yet: version 0, the default placement, is live)")
    for c in versions:
        m = c.metadata
        metrics = m.get("metrics") or {}
        what = (f"rollback to v{m['rollback_to']}" if m.get("rollback_to") is not None
                else m.get("method", "?"))
        print(f"  v{c.version:<4} {_ts(c.timestamp)}  {what:<16} plan {m.get('plan_id', '-')}"
              f"  table {m.get('table_size', '?')} keys"
              f"  imbalance {_f(metrics.get('imbalance_before'))} -> "
              f"{_f(metrics.get('imbalance_after'))}"
              f"  moved {metrics.get('moved_keys', '?')} keys ({_pct(metrics.get('migration_fraction'))})"
              f"  run {m.get('run_id', '-')}" + ("  <- live" if c.version == live else ""))
    print(f"\nPlan commits ({store.path(PLANS)})")
    if not plan_commits:
        print("  (no plans yet)")
    for c in plan_commits:
        m = c.metadata
        if "plan_id" not in m:
            continue
        plan = plans.get(m["plan_id"])
        extra = ""
        if m.get("action") == "verify" and plan is not None:
            extra = (f"  realised {_f(plan.realised_imbalance)} vs predicted "
                     f"{_f(plan.predicted_imbalance)}")
        if m.get("action") == "reject" and plan is not None:
            extra = "  reasons: " + "; ".join(plan.reasons)[:300]
        if m.get("action") == "apply" and m.get("assignment_version") is not None:
            extra = f"  -> assignment v{m['assignment_version']}"
        print(f"  {c.version:>4} {_ts(c.timestamp)}  {m.get('action', c.operation):<9}"
              f" plan {m['plan_id']}  {m.get('method', '?'):<8} {m.get('run_type', '')}"
              f" run {m.get('run_id', '-')}{extra}")
    return 0


def _commit(c) -> dict[str, Any]:
    return {"version": c.version, "timestamp": c.timestamp, "operation": c.operation,
            "metadata": c.metadata}


def _ts(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _f(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "?"


def _pct(value) -> str:
    return f"{100 * value:.1f}% of state" if isinstance(value, (int, float)) else "?"


# ------------------------------------------------------------------- rollback
def rollback(args: argparse.Namespace) -> int:
    """Restore assignment version V as a new version, through validation, publish and apply."""
    from . import pipeline
    from .spark.plan_store import PlanStoreError

    _check_rollback_args(args)
    spark = pipeline.spark_session()
    try:
        payload = propose_rollback(spark, args.to_version, theta=args.theta,
                                   lookback_windows=args.lookback_windows, dry_run=args.dry_run)
    except (LookupError, ValueError, PlanStoreError) as exc:
        print(f"rebalance rollback: error: {exc}", file=sys.stderr)
        return 2
    plan = payload["plan"]
    print(f"rollback plan {plan['plan_id']}: restore v{args.to_version} over live "
          f"v{payload['inputs']['base_assignment_version']}, {plan['moved_keys']} keys move, "
          f"imbalance {_f(plan['imbalance_before'])} -> {_f(plan['predicted_imbalance'])}")
    try:
        payload = pipeline.validate(payload)
        payload = pipeline.publish(payload)
        if args.dry_run:
            print(f"dry run: plan {plan['plan_id']} is {payload['plan']['status']}; "
                  "the live assignment is unchanged")
            return 0
        payload = pipeline.apply(payload)
    except (pipeline.PlanRejected, pipeline.ApplyRefused) as exc:
        print(f"rollback refused: {exc}", file=sys.stderr)
        return 1
    print(f"assignment version {payload['plan']['assignment_version']} is live: the routing "
          f"table of v{args.to_version} (plan {plan['plan_id']})")
    return 0


def _check_rollback_args(args: argparse.Namespace) -> None:
    """Refuse bad numbers before Spark starts (issue 14): one line, exit 2."""
    import math

    from .cli import UserError

    if args.to_version < 0:
        raise UserError(f"--to-version must be >= 0, got {args.to_version}")
    if args.theta is not None and not (math.isfinite(args.theta) and args.theta > 0):
        raise UserError(f"--theta must be a number > 0, got {args.theta}")
    if args.lookback_windows < 1:
        raise UserError(f"--lookback-windows must be >= 1, got {args.lookback_windows}")


def propose_rollback(spark, to_version: int, theta: float | None = None,
                     lookback_windows: int = 6, dry_run: bool = False) -> dict[str, Any]:
    """Store the plan that restores ``to_version``: returns the payload for validate/publish/apply.

    The plan's frame covers every key of the live and the restored routing tables and of
    the latest windows; loads and state come from the latest ``lookback_windows`` windows
    (zero for keys without traffic). Idempotent: the plan id is a hash of the target, the
    live version and the histogram version, so a repeated command finds the stored plan.
    """
    from . import pipeline
    from .model import Problem, evaluate
    from .placement import default_instances
    from .spark import tables
    from .spark.plan_store import PlanRecord, PlanStatus, PlanStore

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
    if live.routing == target.routing:
        raise ValueError(f"the live assignment v{live_version} already routes exactly as "
                         f"v{to_version}: nothing to restore")
    n = live.n_instances
    loads, states, windows, hist_version = _latest_loads(spark, lookback_windows)
    keys = np.array(sorted(set(live.routing) | set(target.routing) | set(loads)), dtype=object)
    default = default_instances(keys, n)
    current = np.array([live.routing.get(k, d) for k, d in zip(keys, default)], dtype=np.int64)
    restored = np.array([target.routing.get(k, d) for k, d in zip(keys, default)], dtype=np.int64)
    problem = Problem(keys=keys, load=np.array([loads.get(k, 0.0) for k in keys]),
                      state=np.array([states.get(k, 0.0) for k in keys]), current=current,
                      default=default, n_instances=n)
    metrics = evaluate(problem, restored).to_dict()
    bound = theta if theta is not None else max(0.1, metrics["imbalance_after"] - 1 + 1e-6)
    mode = "dry-run" if dry_run else "auto"
    params = pipeline.RunParams(theta=bound, max_table=None, migration_budget=None,
                                apply_mode="auto" if not dry_run else "dry-run", force=True)
    run = pipeline.RunInfo(ROLLBACK_DAG_ID, f"rollback-to-v{to_version}-from-v{live_version}",
                           "rollback", None, None)
    inputs = {"windows": windows, "key_histograms_version": hist_version,
              "base_assignment_version": live_version, "n_instances": n,
              "n_keys": int(len(keys)), "total_state": float(problem.state.sum()),
              "events": 0, "rollback_to": int(to_version)}
    plan_id = hashlib.sha256(json.dumps(
        {"rollback_to": to_version, "live": live_version, "histograms": hist_version,
         "theta": bound, "mode": mode}, sort_keys=True).encode()).hexdigest()[:20]
    store = PlanStore(spark)
    record = store.get(plan_id)
    if record is None:
        frame = pipeline.assignment_frame(problem, restored)
        record = store.propose(PlanRecord(
            plan_id=plan_id, status=PlanStatus.PROPOSED.value, method="rollback",
            dag_id=run.dag_id, run_id=run.run_id, run_type=run.run_type,
            params=params.to_dict(), metrics=metrics, inputs=inputs, apply_mode=mode,
            reasons=[f"rollback to assignment version {to_version}"],
            base_assignment_version=live_version,
            predicted_imbalance=float(metrics["imbalance_after"])), frame)
    return {"run": run.to_dict(), "params": params.to_dict(), "inputs": inputs,
            "plan": record.summary()}


def _latest_loads(spark, lookback: int) -> tuple[dict[str, float], dict[str, float], list[str], int | None]:
    """Per-key load (cost per window, as in ``rebalance.histograms``) and state of the latest
    windows, if any."""
    from pyspark.sql import functions as F

    from .spark import tables
    from .spark.plan_store import as_utc

    if not tables.exists(spark, tables.KEY_HISTOGRAMS):
        return {}, {}, [], None
    version = tables.history(spark, tables.KEY_HISTOGRAMS, limit=1)[0].version
    df = tables.read(spark, tables.KEY_HISTOGRAMS, version=version)
    starts = [r.window_start for r in df.select("window_start").distinct()
              .orderBy(F.col("window_start").desc()).limit(lookback).collect()]
    if not starts:
        return {}, {}, [], version
    pdf = (df.where(F.col("window_start").isin(starts))
           .groupBy("window_start", "key").agg(F.sum("cost").alias("cost"),
                                               F.max("state_bytes").alias("state"))
           .toPandas())
    load = (pdf.groupby("key")["cost"].sum() / len(starts)).to_dict()
    state = pdf.sort_values("window_start").groupby("key")["state"].last().to_dict()
    return ({k: float(v) for k, v in load.items()}, {k: float(v) for k, v in state.items()},
            sorted(as_utc(s).isoformat() for s in starts), version)

