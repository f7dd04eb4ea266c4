"""``rebalance apply`` and ``rebalance status``: the DAG's publish path from the command line.

``rebalance apply --plan DIR`` takes a plan written by ``rebalance plan --out DIR``, checks
its files, refuses it as stale when it was computed against another assignment version
than the live one, and stores, validates, publishes and applies it as the DAG does, each
step a commit of the audit trail; ``--dry-run`` stops after the gate. Exit codes: 0
applied, 1 refused, 2 bad input. ``rebalance status`` prints what is live now. The steps
and the checks: ``docs/planning.md``, "Making a plan live".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: Run identity of plans applied from the command line.
CLI_DAG_ID = "rebalance-cli"


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser(
        "apply", help="publish a plan made by `rebalance plan` through the DAG's gate, lease and audit trail",
        description="Validate, publish and apply the plan in DIR (plan.json, assignment.parquet) "
                    "as the next assignment version, as the rebalance DAG does; refuses a stale "
                    "plan.")
    p.add_argument("--plan", required=True, metavar="DIR", help="directory written by `rebalance plan --out`")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and store the plan as what-if; change nothing live")
    p.add_argument("--apply-mode", default="auto", choices=("auto", "broadcast", "restart"),
                   help="as the DAG's apply_mode (default auto: a live switch unless the plan "
                        "moves more than 5%% of the state)")
    p.set_defaults(func=apply_plan)
    s = subparsers.add_parser(
        "status", help="live assignment version, N, latest windows' imbalance, last plan",
        description="What is live now: the assignment version and N, the imbalance of the "
                    "latest histogram windows, and the last plan with its status.")
    s.add_argument("--windows", type=int, default=3, metavar="W",
                   help="latest windows to show (default 3)")
    s.set_defaults(func=status)


# ---------------------------------------------------------------------- apply
#: Largest ``status --windows`` (a Spark LIMIT is a Java int; no job keeps more windows).
MAX_STATUS_WINDOWS = 100_000


def cli_spark_session():
    """The control plane's session for a command: a JVM started here writes its stderr
    (the "Using incubator modules" warning, log4j's ERROR lines and Java stack traces)
    to its log file, so a refusal stays one line."""
    from rebalance.control.inputs import spark_session
    from rebalance.spark.session import jvm_stderr_to, spark_log_file

    with jvm_stderr_to(spark_log_file("rebalance-dag")):
        return spark_session()


def refuse_unreadable_tables(spark, root=None) -> None:
    """One line naming the path of a project table that exists but is no readable Delta
    table (corrupt ``_delta_log``, a plain folder), before any command reads it."""
    from rebalance.spark import tables
    from rebalance.spark.plan_store import CONTROL, PLAN_ASSIGNMENTS, PLANS

    for table in (tables.ASSIGNMENTS, tables.KEY_HISTOGRAMS, PLANS, PLAN_ASSIGNMENTS, CONTROL):
        tables.check_readable(spark, table, root)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    import math

    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


_MISSING = object()


def check_plan_document(document: Any, where: Path) -> dict[str, Any]:
    """The fields of plan.json ``rebalance apply`` uses, each checked for its type and
    range (one line naming the field and value): any JSON value may arrive here."""
    from rebalance.cli import UserError
    from rebalance.cli.plan import FORMAT_VERSION
    from rebalance.core.model import MAX_INSTANCES
    from rebalance.core.planner_names import METHODS

    def bad(field: str, value: Any, expected: str) -> UserError:
        if value is _MISSING:
            return UserError(f"{where}: {field} is missing (expected {expected})")
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return UserError(f"{where}: {field} must be {expected}, got {shown}")

    if not isinstance(document, dict):
        raise UserError(f"{where} must hold a JSON object, got {type(document).__name__}: "
                        "not a plan written by `rebalance plan --out`")
    if not (_is_int(document.get("format_version"))
            and document["format_version"] == FORMAT_VERSION):  # not true, not 1.0
        raise UserError(f"{where}: format_version {document.get('format_version')!r}, "
                        f"expected {FORMAT_VERSION}")
    for name in ("assignment_file", "parameters", "metrics"):
        if not isinstance(document.get(name), dict):
            raise bad(name, document.get(name, _MISSING), "a JSON object")
    if not isinstance(document.get("method", _MISSING), str):
        raise bad("method", document.get("method", _MISSING), "a string")
    named = document["assignment_file"]
    sha = named.get("sha256", _MISSING)
    if not (isinstance(sha, str) and len(sha) == 64):
        raise bad("assignment_file.sha256", sha, "a SHA-256 digest (64 hex digits)")
    if not (_is_int(named.get("rows", _MISSING)) and named["rows"] >= 0):
        raise bad("assignment_file.rows", named.get("rows", _MISSING), "an integer >= 0")
    p = document["parameters"]
    if not (isinstance(p.get("histograms", _MISSING), str) and p["histograms"]):
        raise bad("parameters.histograms", p.get("histograms", _MISSING), "a path")
    if not (_is_int(p.get("instances", _MISSING)) and 1 <= p["instances"] <= MAX_INSTANCES):
        raise bad("parameters.instances", p.get("instances", _MISSING),
                  f"an integer within [1, {MAX_INSTANCES}]")
    if not (_is_int(p.get("windows", _MISSING)) and p["windows"] >= 1):
        raise bad("parameters.windows", p.get("windows", _MISSING), "an integer >= 1")
    if p.get("method", _MISSING) not in METHODS:
        raise bad("parameters.method", p.get("method", _MISSING), f"one of {', '.join(METHODS)}")
    if not (_is_number(p.get("theta", _MISSING)) and p["theta"] > 0):
        raise bad("parameters.theta", p.get("theta", _MISSING), "a number > 0")
    if p.get("max_table") is not None and not (_is_int(p["max_table"]) and p["max_table"] >= 0):
        raise bad("parameters.max_table", p["max_table"], "null or an integer >= 0")
    budget = p.get("migration_budget_bytes")
    if budget is not None and not (_is_number(budget) and budget >= 0):
        raise bad("parameters.migration_budget_bytes", budget, "null or a number >= 0")
    after = document["metrics"].get("imbalance_after", _MISSING)
    if not (_is_number(after) and after >= 0):
        raise bad("metrics.imbalance_after", after, "a number >= 0")
    document["split"] = plan_splits(document.get("split", []), p["instances"], where)
    return document


def plan_splits(split: Any, n_instances: int, where: Path) -> dict[str, dict[int, float]]:
    """plan.json's ``split`` (``rebalance plan --split-keys``: a list of ``{"key",
    "instances", "shares"}``) as key -> {instance: share}, each entry checked."""
    from rebalance.cli import UserError
    from rebalance.core.assignment import AssignmentError, validate_splits

    if not isinstance(split, list):
        raise UserError(f"{where}: split must be a list of split keys, got "
                        f"{type(split).__name__}")
    out: dict[str, dict[int, float]] = {}
    for i, entry in enumerate(split):
        if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)
                and isinstance(entry.get("instances"), list)
                and isinstance(entry.get("shares"), list)
                and len(entry["instances"]) == len(entry["shares"])
                and all(_is_int(v) for v in entry["instances"])
                and all(_is_number(v) for v in entry["shares"])):
            raise UserError(f"{where}: split[{i}] must be {{\"key\": string, \"instances\": "
                            "[integers], \"shares\": [numbers, one per instance]}")
        if entry["key"] in out:
            raise UserError(f"{where}: split key {entry['key']!r} is listed twice")
        out[entry["key"]] = dict(zip(entry["instances"], entry["shares"]))
        if len(out[entry["key"]]) != len(entry["instances"]):
            raise UserError(f"{where}: split key {entry['key']!r} lists an instance twice")
    try:
        return validate_splits(out, n_instances)
    except AssignmentError as exc:
        raise UserError(f"{where}: {exc}") from None


def check_assignment_table(table, document: dict[str, Any], where: Path) -> None:
    """The assignment file's columns (``key`` string, ``instance`` integer in [0, N),
    ``moved`` boolean, no nulls) and its row count against plan.json."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rebalance.cli import UserError

    kinds = {"key": ("string", (pa.types.is_string, pa.types.is_large_string)),
             "instance": ("integer", (pa.types.is_integer,)),
             "moved": ("bool", (pa.types.is_boolean,))}
    for name, (expected, checks) in kinds.items():
        if name not in table.column_names:
            raise UserError(f"{where} lacks the column {name!r} (has: "
                            f"{', '.join(table.column_names) or 'none'})")
        column = table.column(name)
        if not any(check(column.type) for check in checks):
            raise UserError(f"{where}: column {name!r} has type {column.type}, expected "
                            f"{expected}")
        if column.null_count:
            raise UserError(f"{where}: column {name!r} holds {column.null_count} null(s)")
    rows = document["assignment_file"]["rows"]
    if table.num_rows != rows:
        raise UserError(f"{where} has {table.num_rows} rows, plan.json names {rows}")
    n = document["parameters"]["instances"]
    if table.num_rows:
        lo, hi = (v.as_py() for v in pc.min_max(table.column("instance")).values())
        if lo < 0 or hi >= n:
            raise UserError(f"{where}: column 'instance' holds {lo if lo < 0 else hi}, "
                            f"outside [0, {n}) (plan.json: {n} instances)")


def read_plan_dir(path: str | Path) -> tuple[dict[str, Any], Any]:
    """``plan.json`` and the assignment table of a plan directory, checked against each other."""
    import hashlib

    import pyarrow.parquet as pq

    from rebalance.cli import UserError
    from rebalance.cli.plan import ASSIGNMENT_FILE, PLAN_FILE

    directory = Path(path)
    if not str(path):
        raise UserError("--plan is empty: name the directory `rebalance plan --out` wrote")
    if not directory.is_dir():
        raise UserError(f"--plan {directory} is not a directory "
                        f"({'not found' if not directory.exists() else 'a file'})")
    try:
        text = (directory / PLAN_FILE).read_text(encoding="utf-8")
        data = (directory / ASSIGNMENT_FILE).read_bytes()
    except (OSError, UnicodeDecodeError) as exc:
        name = getattr(exc, "filename", None) or directory / PLAN_FILE
        raise UserError(f"{directory} is not a plan written by `rebalance plan --out`: "
                        f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        document = json.loads(text)
    except RecursionError:
        raise UserError(f"{directory / PLAN_FILE} is nested too deeply to be a plan") from None
    except ValueError as exc:
        raise UserError(f"{directory / PLAN_FILE} is not JSON: {exc}") from None
    document = check_plan_document(document, directory / PLAN_FILE)
    if document["assignment_file"]["sha256"] != hashlib.sha256(data).hexdigest():
        raise UserError(f"{directory / ASSIGNMENT_FILE} is not the assignment {PLAN_FILE} names "
                        "(SHA-256 differs): write the plan again")
    try:
        table = pq.read_table(directory / ASSIGNMENT_FILE)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
        from rebalance.core.histogram_files import first_line

        raise UserError(f"cannot read {directory / ASSIGNMENT_FILE} as Parquet: "
                        f"{first_line(exc)}") from None
    check_assignment_table(table, document, directory / ASSIGNMENT_FILE)
    return document, table


def _problem_over_live(document: dict[str, Any], n_instances: int, routing: dict[str, int]):
    """The plan's histograms read again with the live routing table as the current assignment."""
    import pandas as pd

    from rebalance.core.histogram_files import read_histogram_table
    from rebalance.core.histograms import build_problem

    params = document["parameters"]
    frame = read_histogram_table(params["histograms"])
    current = pd.DataFrame({"key": list(routing), "instance": list(routing.values())},
                           columns=["key", "instance"]).astype({"instance": "int64"})
    problem, _ = build_problem(frame, n_instances, current, windows=int(params["windows"]))
    return problem


def _planned(problem, table) -> Any:
    """The plan's instances in the problem's key order; None when the key sets differ."""
    import numpy as np

    keys = [str(k) for k in table.column("key").to_pylist()]
    if len(keys) != problem.n_keys or set(keys) != set(map(str, problem.keys)):
        return None
    position = {k: i for i, k in enumerate(keys)}
    order = np.fromiter((position[str(k)] for k in problem.keys), np.int64, problem.n_keys)
    instance = np.asarray(table.column("instance").to_numpy(), dtype=np.int64)[order]
    moved = np.asarray(table.column("moved").to_numpy(zero_copy_only=False), dtype=bool)[order]
    return instance, moved


def stale_reason(problem, instance, moved, live_version: int,
                 splits: dict[str, dict[int, float]] | None = None) -> str | None:
    """Why the plan was not computed against the live assignment (None when it was). A
    split key (``splits``) is moved when none of its instances is its current one."""
    import numpy as np

    from rebalance.core.records import moved_mask

    leaves = moved_mask(problem.keys, instance, problem.current, splits)
    kept_elsewhere = ~moved & leaves
    moved_nowhere = moved & ~leaves
    wrong = int(kept_elsewhere.sum() + moved_nowhere.sum())
    if wrong:
        k = problem.keys[int(np.flatnonzero(kept_elsewhere | moved_nowhere)[0])]
        return (f"stale plan: {wrong} key(s) (e.g. {k!r}) are not where the plan found them in "
                f"the live assignment version {live_version}; it was computed against another "
                "assignment: plan again (`rebalance plan --assignment`)")
    return None


def apply_plan(args: argparse.Namespace) -> int:
    """``rebalance apply --plan DIR``."""
    import numpy as np

    from rebalance.cli import UserError
    from rebalance.control import rollout
    from rebalance.control.errors import ApplyRefused, PlanRejected, RunSkipped
    from rebalance.control.inputs import assignment_frame, plan_store
    from rebalance.control.params import RunInfo, RunParams
    from rebalance.core.records import PlanRecord, PlanStatus, hash_id
    from rebalance.spark import tables

    document, table = read_plan_dir(args.plan)
    spark = cli_spark_session()
    refuse_unreadable_tables(spark)
    if not tables.exists(spark, tables.ASSIGNMENTS):
        raise UserError("no assignments table yet (the streaming job creates it at start)")
    live_version = tables.latest_assignment_version(spark)
    n = int(tables.assignments_n_instances(spark))
    if int(document["parameters"]["instances"]) != n:
        raise UserError(f"the plan is for {document['parameters']['instances']} instances, the "
                        f"live assignment has {n}")
    live = tables.read_assignment(spark, version=live_version)
    problem = _problem_over_live(document, n, live.routing)
    planned = _planned(problem, table)
    if planned is None:
        print(f"rebalance apply: refused: stale plan: its keys are not the keys of its "
              f"histograms ({document['parameters']['histograms']}) over the live assignment "
              f"version {live_version}: plan again", file=sys.stderr)
        return 1
    instance, moved = planned
    splits = document["split"]
    reason = stale_reason(problem, instance, moved, live_version, splits)
    if reason:
        print(f"rebalance apply: refused: {reason}", file=sys.stderr)
        return 1

    parameters = document["parameters"]
    total_state = float(problem.state.sum())
    budget = parameters.get("migration_budget_bytes")
    fraction = None if budget is None else (min(1.0, float(budget) / total_state)
                                            if total_state > 0 else 0.0)
    params = RunParams(method=parameters["method"], theta=float(parameters["theta"]),
                       max_table=parameters.get("max_table"), migration_budget=fraction,
                       apply_mode="dry-run" if args.dry_run else args.apply_mode, force=True)
    params.check()
    plan_id = hash_id({"plan": document["assignment_file"]["sha256"], "live": live_version,
                       "mode": params.apply_mode})
    run = RunInfo(CLI_DAG_ID, f"apply-{plan_id}", "manual", None, None)
    inputs = {"windows": [], "events": 0, "key_histograms_version": None,
              "base_assignment_version": live_version,
              "n_instances": n, "n_keys": problem.n_keys, "total_state": total_state,
              "plan_dir": str(Path(args.plan).resolve()),
              "histograms": str(parameters["histograms"])}
    store = plan_store(spark)
    record = store.get(plan_id)
    if record is None:
        metrics = document["metrics"]
        record = store.propose(PlanRecord(
            plan_id=plan_id, status=PlanStatus.PROPOSED.value, method=str(document["method"]),
            dag_id=run.dag_id, run_id=run.run_id, run_type=run.run_type,
            params=params.to_dict(), metrics=metrics, inputs=inputs, apply_mode=params.apply_mode,
            reasons=[f"rebalance apply --plan {args.plan}"], base_assignment_version=live_version,
            predicted_imbalance=float(metrics["imbalance_after"])),
            assignment_frame(problem, np.asarray(instance), splits))
    payload = {"run": run.to_dict(), "params": params.to_dict(), "inputs": inputs,
               "plan": record.summary()}
    try:
        payload = rollout.gate_and_apply(payload, dry_run=args.dry_run)
    except (PlanRejected, ApplyRefused, RunSkipped) as exc:
        print(f"rebalance apply: refused: {exc}", file=sys.stderr)
        return 1
    plan = payload["plan"]
    if args.dry_run:
        print(f"dry run: plan {plan_id} passed validation and is stored as "
              f"{plan['status']}; the live assignment v{live_version} is unchanged")
        return 0
    print(f"plan {plan_id} ({plan['method']}) applied ({plan['apply_mode']}): assignment "
          f"version {plan['assignment_version']} is live; imbalance "
          f"{plan['imbalance_before']:.4f} -> {plan['predicted_imbalance']:.4f} predicted, "
          f"{plan['moved_keys']} key(s) moved")
    if plan["apply_mode"] != params.apply_mode and plan.get("reasons"):
        print(f"note: {plan['reasons'][-1]}")  # auto switched a job that cannot restart live
    return 0


# --------------------------------------------------------------------- status
def latest_windows(spark, n_instances: int, n_windows: int
                   ) -> list[tuple[str, float | None, int]]:
    """(window start, imbalance over the N instances, assignment version) of the latest
    windows, oldest first (:func:`rebalance.spark.loads.window_loads`)."""
    from rebalance.core.records import as_utc
    from rebalance.spark.loads import window_loads

    w = window_loads(spark, n_instances, latest=n_windows)
    return [(as_utc(start).isoformat(), value, version)
            for start, value, version in zip(w.windows, w.imbalances(), w.versions)]


def status(args: argparse.Namespace) -> int:
    """``rebalance status``."""
    from rebalance.cli import UserError
    from rebalance.core.records import STATUS_ORDER, PlanStatus
    from rebalance.spark import tables

    if not 1 <= args.windows <= MAX_STATUS_WINDOWS:
        raise UserError(f"--windows must be within [1, {MAX_STATUS_WINDOWS}], got {args.windows}")
    from rebalance.spark.plan_store import PlanStore

    spark = None  # reads only: delta-rs reads every table location (no JVM starts)
    refuse_unreadable_tables(spark)
    if not tables.exists(spark, tables.ASSIGNMENTS):
        print("no assignments table yet: the streaming job creates it at start")
        return 0
    live = tables.read_assignment(spark)
    n = int(tables.assignments_n_instances(spark))
    print(f"live assignment: version {live.version}, N = {n}, routing table "
          f"{len(live.routing)} key(s)")
    windows = latest_windows(spark, n, args.windows)
    if not windows:
        print("windows: none stored yet")
    for start, value, version in windows:
        shown = "- (no load)" if value is None else f"{value:.3f}"
        print(f"window {start}: imbalance {shown} (assignment v{version})")
    plans = PlanStore(spark).plans()
    if not plans:
        print("last plan: none")
        return 0
    # The latest change, and of two in one second the later status (applied after what-if).
    last = max(plans, key=lambda p: (p.updated_at or p.created_at,
                                     STATUS_ORDER[PlanStatus(p.status)]))
    m = last.metrics
    realised = ("" if last.realised_imbalance is None
                else f", realised {last.realised_imbalance:.3f}")
    print(f"last plan: {last.plan_id} ({last.method}) {last.status}: imbalance "
          f"{m.get('imbalance_before', float('nan')):.3f} -> "
          f"{last.predicted_imbalance if last.predicted_imbalance is not None else float('nan'):.3f}"
          f" predicted{realised}, {m.get('moved_keys')} key(s) moved, run {last.run_id}")
    return 0
