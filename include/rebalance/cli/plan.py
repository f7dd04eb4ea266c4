"""``rebalance plan``: compute a new key-to-instance assignment from key histograms.

    rebalance plan --histograms PATH --instances N [--assignment PATH] [--method M]
                   [--theta T] [--max-table A] [--windows W] [--migration-budget B]
                   [--time-limit S] --out DIR

Aggregates the last W windows of the histograms (Delta, Parquet or CSV) into a problem
(:mod:`rebalance.core.histograms`), runs a planner of :mod:`rebalance.core.planners` and
writes ``DIR/plan.json`` and ``DIR/assignment.parquet``, each renamed into place. Bad input
raises :class:`~rebalance.cli.UserError` (one line, exit code 2) and writes nothing. Heavy
imports happen inside :func:`run_plan`. Inputs, outputs and refusals: ``docs/planning.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from rebalance.cli.load_model import add_plan_arguments, check_plan_arguments, load_for_plan
from rebalance.core.defaults import DEFAULT_THETA, theta_problem
from rebalance.core.planner_names import METHODS

PLAN_FILE = "plan.json"
ASSIGNMENT_FILE = "assignment.parquet"
FORMAT_VERSION = 1


#: What ``rebalance plan --help`` says (for users; the module docstring is for developers).
HELP = """\
Plan a new key-to-instance assignment from per-window key histograms (a Delta table
directory, a Parquet file or directory, or a CSV file) and write it to DIR:

  DIR/plan.json           parameters, input summary, metrics, load model and why,
                          feasibility, timings
  DIR/assignment.parquet  key, instance, moved: one row per key of the input

By default (--load-model auto) the load the plan is made for is chosen by replaying the
windows given: the model whose plans kept the most following windows within 1 + theta,
or the current assignment when no plan would have beaten keeping it. With one window,
the plan is made on it.

DIR is replaced as a whole or not at all; bad input is refused in one line (exit 2) and
writes nothing.
"""


def add_subcommands(subparsers) -> None:
    """Add ``plan`` to the ``rebalance`` command's subparsers."""
    p = subparsers.add_parser(
        "plan", help="plan a balanced key-to-instance assignment from key histograms",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--histograms", required=True, metavar="PATH",
                   help="Delta table directory, Parquet file/directory or CSV file with columns "
                        "window_start, key, count [, cost, state_bytes]")
    p.add_argument("--instances", required=True, type=int, metavar="N",
                   help="number of instances to plan for (>= 1)")
    p.add_argument("--assignment", metavar="PATH",
                   help="current assignment (Parquet or CSV with columns key, instance); "
                        "unlisted keys are on their default placement")
    p.add_argument("--method", default="auto", metavar="M",
                   help=f"planner (default auto): {', '.join(METHODS)}")
    p.add_argument("--theta", type=float, default=DEFAULT_THETA, metavar="T",
                   help="imbalance bound: every instance load <= (1 + T) * mean (default "
                        f"{DEFAULT_THETA})")
    p.add_argument("--max-table", type=int, default=None, metavar="A",
                   help="largest routing table (keys off their default placement); default none")
    p.add_argument("--windows", type=int, default=None, metavar="W",
                   help="plan over the last W histogram windows (default 1, or what "
                        "--load-model auto chooses; given with auto, every model auto tries "
                        "reads W windows)")
    p.add_argument("--migration-budget", type=float, default=None, metavar="B",
                   help="largest migration: a fraction of the total state if B <= 1, "
                        "else bytes (default none)")
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                   help="seconds for planners that search (milp, auto); default 10")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory for plan.json and assignment.parquet")
    p.add_argument("--split-keys", action="store_true",
                   help="spread keys too hot for any one instance over several, with shares "
                        "(plan.json lists them under split); the job sends each event of such "
                        "a key to one share and merges a window's partials in window_results")
    add_plan_arguments(p)
    p.set_defaults(func=run_plan)


def _check_args(args: argparse.Namespace):
    from rebalance.cli import UserError
    from rebalance.core.model import MAX_INSTANCES

    if args.instances < 1:
        raise UserError(f"--instances must be >= 1, got {args.instances}")
    if args.instances > MAX_INSTANCES:
        raise UserError(f"--instances must be <= {MAX_INSTANCES} (the key groups of the default "
                        f"placement), got {args.instances}")
    if problem := theta_problem(args.theta, "--theta"):
        raise UserError(problem)
    if args.windows is not None and args.windows < 1:
        raise UserError(f"--windows must be >= 1, got {args.windows}")
    if args.max_table is not None and args.max_table < 0:
        raise UserError(f"--max-table must be >= 0, got {args.max_table}")
    b = args.migration_budget
    if b is not None and not (math.isfinite(b) and b >= 0):
        raise UserError(f"--migration-budget must be a number >= 0, got {b}")
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise UserError(f"--time-limit must be a finite number > 0 (seconds), "
                        f"got {args.time_limit}")
    check_plan_arguments(args)
    check_plan_out(args.out)


def check_plan_out(text: str) -> None:
    """Refuse an ``--out`` that cannot be replaced as a whole, before any work.

    The plan is written into a fresh sibling folder that then takes DIR's place
    (:func:`write_plan`): so DIR's parent must be writable, and an existing DIR's
    plan.json and assignment.parquet must be regular files (an earlier plan).
    """
    from rebalance.cli import UserError

    if not text or not text.strip():
        raise UserError("--out is empty: name the folder for plan.json and assignment.parquet")
    out = Path(os.path.abspath(text))
    if out == out.parent:
        raise UserError(f"--out {text} is the file system's root")
    cwd = Path(os.getcwd())
    if out == cwd or out in cwd.parents:
        raise UserError(f"--out {text} holds the current directory, which the plan's folder "
                        "would replace: name a folder for the plan alone")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"--out {text} exists and is not a directory")
    for name in (PLAN_FILE, ASSIGNMENT_FILE):
        entry = out / name
        if entry.is_symlink() or (entry.exists() and not entry.is_file()):
            raise UserError(f"--out {text}: {entry} is not a regular file, so it is no "
                            "earlier plan `rebalance plan` may replace")
    check_out_dir(out if not out.exists() else out.parent)


def check_out_dir(out: Path) -> None:
    """Refuse an output directory that cannot be created or written, before any work.

    A directory is created (and removed at once) in ``out`` if it exists, else in its
    nearest existing ancestor: what ``write_plan`` will do there, so permissions,
    read-only and pseudo file systems (``/proc``) are all caught here.
    """
    from rebalance.cli import UserError

    base = out.absolute()
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise UserError(f"--out {out} cannot be created: {base} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rebalance-probe-", dir=base))
    except OSError as exc:
        raise UserError(f"--out {out} cannot be created: {exc.strerror or exc} "
                        f"(in {base})") from None


def budget_bytes(budget: float | None, total_state: float) -> float | None:
    """``--migration-budget``: a fraction of the total state if <= 1, else bytes."""
    if budget is None:
        return None
    return float(budget) * total_state if budget <= 1 else float(budget)


def run_plan(args: argparse.Namespace) -> int:
    """Load, plan, write; returns 0 (an infeasible plan is still written, feasible=false)."""
    with warnings.catch_warnings():
        # Library warnings (pandas, numpy, PuLP) are not for the user of a command whose
        # refusals are one line; every condition they could flag is checked explicitly.
        warnings.simplefilter("ignore")
        return _run_plan(args)


def _run_plan(args: argparse.Namespace) -> int:
    from rebalance.cli import UserError
    from rebalance.core.model import PlanningError, PlanParams
    from rebalance.core.planners import get_planner

    _check_args(args)
    if args.method not in METHODS:
        raise UserError(f"unknown --method {args.method!r}; choose one of {', '.join(METHODS)}")
    import pyarrow as pa

    # Arrow's buffers from malloc, like numpy's: memory the input tables free is reused by
    # the arrays built from them (10^7 keys: peak 3.1 -> 2.5 GB; mimalloc keeps its own).
    pa.set_memory_pool(pa.system_memory_pool())
    _no_huge_page_advice()
    t0 = time.perf_counter()
    # the load model (auto: chosen by backtest over the windows given) and theta_plan
    problem, summary, keys, theta_plan, load_model = load_for_plan(args)
    total_state = float(problem.state.sum())
    budget = budget_bytes(args.migration_budget, total_state)
    try:
        params = PlanParams(theta=theta_plan, max_table=args.max_table,
                            budget_bytes=budget, time_limit=float(args.time_limit))
    except PlanningError as exc:
        raise UserError(str(exc)) from None
    t1 = time.perf_counter()
    if load_model.get("stay"):
        from rebalance.core.planners import Proposal, finish_plan

        plan = finish_plan(args.method, problem, params,
                           Proposal(problem.current, [f"auto: {load_model['reason']}"]), 0.0)
    elif getattr(args, "split_keys", False):
        from rebalance.core.planners.split import plan_split

        plan = plan_split(problem, params, base=args.method)
    else:
        plan = get_planner(args.method).plan(problem, params)
    t2 = time.perf_counter()

    document = plan_document(args, summary, plan, budget)
    document["load_model"] = _number(load_model)
    if plan.split is not None and len(plan.split):
        document["split"] = _number(plan.split.records(problem.keys))
    frame = _assignment_table(keys, plan)
    timings = {"input_seconds": t1 - t0, "plan_seconds": plan.plan_seconds,
               "planner_wall_seconds": t2 - t1}
    try:
        write_plan(Path(args.out), document, frame, timings=timings)
    except OSError as exc:
        raise UserError(f"cannot write the plan to {args.out}: {exc.strerror or exc}") from None
    m = plan.metrics
    print(f"plan {args.method} -> {plan.method}: feasible={plan.feasible} "
          f"imbalance {m.imbalance_before:.4f} -> {m.imbalance_after:.4f}, "
          f"migration {m.migration_fraction:.4%} ({m.moved_keys} keys), table {m.table_size}, "
          f"{plan.plan_seconds:.3f} s; wrote {Path(args.out) / PLAN_FILE}")
    return 0


def _no_huge_page_advice() -> None:
    """Stop numpy advising transparent huge pages for this process's large arrays.

    With the kernel's THP ``defrag = madvise``, every advised allocation may compact
    memory synchronously (the figures: ``docs/planning.md``, "Scale"). The plan's arrays
    are short-lived, so huge pages buy nothing here. (NUMPY_MADVISE_HUGEPAGE=0 does the same
    but must be set before numpy is imported.)"""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # pragma: no cover - another numpy layout
        return
    _set_madvise_hugepage(False)


def _number(x: Any) -> Any:
    """JSON-safe value: numpy scalars to Python, non-finite floats to None."""
    import numpy as np

    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, dict):
        return {k: _number(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_number(v) for v in x]
    return x


def plan_document(args: argparse.Namespace, summary: dict[str, Any], plan, budget) -> dict:
    metrics = plan.metrics_dict()
    return _number({
        "format_version": FORMAT_VERSION,
        "method": args.method,
        "planner": plan.method,
        "feasible": plan.feasible,
        "notes": list(plan.notes),
        "parameters": {
            "histograms": str(args.histograms),
            "instances": args.instances,
            "assignment": None if args.assignment is None else str(args.assignment),
            "method": args.method,
            "theta": args.theta,
            "max_table": args.max_table,
            "windows": args.windows,
            "migration_budget": args.migration_budget,
            "migration_budget_bytes": budget,
            "time_limit": args.time_limit,
            "split_keys": bool(getattr(args, "split_keys", False)),
        },
        "input": summary,
        "metrics": metrics,
    })


def _assignment_table(keys, plan):
    """The assignment file's table: ``keys`` (pyarrow strings, the problem's order)."""
    import numpy as np
    import pyarrow as pa

    from rebalance.core.key_order import arrow_array

    try:
        keys = keys.cast(pa.string())
    except pa.ArrowInvalid:  # more than 2 GiB of key bytes: only large_string holds them
        pass
    return pa.table({
        "key": keys,
        "instance": arrow_array(np.asarray(plan.assignment, dtype=np.int64)),
        "moved": arrow_array(np.asarray(plan.moved, dtype=bool)),
    })


def write_plan(out: Path, document: dict, table, timings: dict | None = None) -> None:
    """Write plan.json and assignment.parquet so that no reader ever sees half a plan.

    Both files are written into a fresh sibling folder ``.DIR.tmp-*`` (with hard links to
    whatever else an existing DIR holds, so other files stay), which then takes DIR's
    place: renamed to DIR when DIR is new, else swapped with it in one atomic
    ``renameat2(RENAME_EXCHANGE)`` (where the file system lacks it: DIR renamed aside,
    the new folder renamed in, the old one restored if that fails). So a refusal, a
    crash or a signal leaves DIR as it was or holding the new plan, never a new
    assignment next to an old plan.json, and the temporary folder is removed (SIGTERM
    runs this cleanup as Ctrl-C does: :class:`rebalance.cli.Terminated`). ``timings`` go
    into plan.json as ``timings``, with ``write_seconds``.
    """
    import hashlib
    import json

    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    out = Path(os.path.abspath(out))
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    with _signals_held():  # the folder exists only once the cleanup below owns it
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    aside = None
    try:
        pq.write_table(table, staging / ASSIGNMENT_FILE)
        digest = hashlib.sha256((staging / ASSIGNMENT_FILE).read_bytes()).hexdigest()
        document = dict(document, assignment_file={"name": ASSIGNMENT_FILE,
                                                   "rows": table.num_rows, "sha256": digest})
        if timings is not None:
            document["timings"] = _number(dict(timings,
                                               write_seconds=time.perf_counter() - t0))
        with open(staging / PLAN_FILE, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2, sort_keys=False, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        with _signals_held():
            if not out.exists():
                try:
                    os.rename(staging, out)
                    return
                except OSError:
                    if not out.is_dir():
                        raise
            _carry_over(out, staging)
            if _exchange(staging, out):
                return  # staging now holds the old plan: removed below
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, aside)  # replaces the empty ``aside``
            try:
                os.rename(staging, out)
            except OSError:
                os.rename(aside, out)
                aside = None
                raise
    finally:
        with _signals_held():
            for folder in (staging, aside):
                if folder is not None and folder.exists():
                    shutil.rmtree(folder, ignore_errors=True)


def _carry_over(old: Path, new: Path) -> None:
    """Hard-link (copy where links fail) every entry of ``old`` but the plan's two files
    into ``new``: files a user keeps next to a plan survive its replacement."""
    for entry in old.iterdir():
        if entry.name in (PLAN_FILE, ASSIGNMENT_FILE):
            continue
        target = new / entry.name
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, target)


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    C library or the file system lacks it (then nothing happened)."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


class _signals_held:
    """Hold SIGINT and SIGTERM (delivered when the block ends) in the main thread, so
    that a folder is never created or swapped without its cleanup owning it."""

    def __enter__(self):
        import signal
        import threading

        self._held = threading.current_thread() is threading.main_thread()
        if self._held:
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK,
                                                {signal.SIGINT, signal.SIGTERM})
        return self

    def __exit__(self, *exc):
        import signal

        if self._held:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        return False
