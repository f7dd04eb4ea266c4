"""``rebalance history`` and ``rebalance rollback``: the audit trail, and undo.

The audit trail is Delta's own history of the ``plans`` and ``assignments`` tables, each
commit with JSON ``userMetadata``. A rollback is a plan like any other (method
``rollback``): stored, gated, published and applied under the same lease as a *new*
assignment version whose routing table equals the old one's. Both are registered by
:func:`add_subcommands`; details: ``docs/dag.md``, "Audit trail and rollback".

    rebalance history [--limit 20] [--json]
    rebalance rollback --to-version 3 [--theta 0.5] [--dry-run]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

from rebalance.core.defaults import theta_problem

#: Largest ``--to-version`` (Delta versions are Java longs) and ``--lookback-windows``
#: (a Spark LIMIT, a Java int; no job keeps more windows): checked before Spark starts.
MAX_VERSION = 2 ** 63 - 1
MAX_LOOKBACK_WINDOWS = 100_000

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
    from rebalance.cli import UserError
    from rebalance.cli.apply import refuse_unreadable_tables
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PLANS, PlanStore

    if args.limit < 0:  # checked before any table is read
        raise UserError(f"--limit must be >= 0 (0: all), got {args.limit}")
    spark = None  # reads only: delta-rs reads every table location (no JVM starts)
    store = PlanStore(spark)
    refuse_unreadable_tables(spark, store.root)
    limit = args.limit or None
    # newest first, and only as many commits as shown (the history is read in pages)
    plan_commits = (list(itertools.islice(tables.commits(spark, PLANS, store.root), limit))
                    if tables.exists(spark, PLANS, store.root) else [])
    versions = (tables.assignment_history(spark, limit=limit)
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
              f"  table {m.get('table_size', '?')} entries"
              + (f" ({m['split_keys']} split keys)" if m.get("split_keys") else "")
              + f"  imbalance {_f(metrics.get('imbalance_before'))} -> "
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
    from rebalance.cli.apply import cli_spark_session, refuse_unreadable_tables
    from rebalance.control import rollout
    from rebalance.control.errors import ApplyRefused, PlanRejected
    from rebalance.control.rollback import propose_rollback
    from rebalance.core.records import PlanStoreError

    _check_rollback_args(args)
    spark = cli_spark_session()
    refuse_unreadable_tables(spark)
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
        payload = rollout.gate_and_apply(payload, dry_run=args.dry_run)
    except (PlanRejected, ApplyRefused) as exc:
        print(f"rollback refused: {exc}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"dry run: plan {plan['plan_id']} is {payload['plan']['status']}; "
              "the live assignment is unchanged")
        return 0
    print(f"assignment version {payload['plan']['assignment_version']} is live: the routing "
          f"table of v{args.to_version} (plan {plan['plan_id']})")
    return 0


def _check_rollback_args(args: argparse.Namespace) -> None:
    """Refuse bad numbers before Spark starts: one line, exit 2."""

    from rebalance.cli import UserError

    if not 0 <= args.to_version <= MAX_VERSION:
        raise UserError(f"--to-version must be within [0, {MAX_VERSION}] (a Delta version), "
                        f"got {args.to_version}")
    if args.theta is not None and (problem := theta_problem(args.theta, "--theta")):
        raise UserError(problem)
    if not 1 <= args.lookback_windows <= MAX_LOOKBACK_WINDOWS:
        raise UserError(f"--lookback-windows must be within [1, {MAX_LOOKBACK_WINDOWS}], "
                        f"got {args.lookback_windows}")
