"""``rebalance backtest``: do plans made on past windows hold in the windows after them?

    rebalance backtest HISTOGRAMS --instances N --theta T [--history W] [--horizon K]
                       [--policies SPEC ...] [--start S] [--step S] [--assignment PATH]
                       [--oracle-windows W] [--out DIR]

Replays the stored windows of HISTOGRAMS with :mod:`rebalance.core.backtest`: each policy
(``MODEL[@THETA_PLAN][/METHOD]``) plans on the windows before a step and is judged on the
next K it has not seen, beside the baselines. What the user sees is :data:`HELP`; the
inputs, outputs and baselines: ``docs/backtest.md``, "On your own history".
"""

from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path

from rebalance.core.defaults import theta_problem

#: What ``rebalance backtest --help`` says (for users).
HELP = """\
Do plans made on past windows hold in the windows after them? Replays the stored windows
of HISTOGRAMS (what `rebalance plan` reads: a Delta table directory, a Parquet file or
directory, or a CSV file): at each step every policy plans on the windows before it,
from its own previous assignment, and is judged on the next K windows it has not seen.

Prints one row per policy and baseline: share of judged windows within 1 + theta, mean
and p90 realised imbalance, migration per step, routing-table size. Baselines: none
(default placement), stay (one plan, kept), oracle (planned on the judged window) and
distribution oracle (planned on the windows after it). With --out: steps.csv,
summary.csv and imbalance.png (realised imbalance over time against 1 + theta).

A policy is MODEL[@THETA_PLAN][/METHOD]: a load model (mean:windows=1, ewm:halflife=3,
quantile:q=0.9, max, seasonal:period=7, robust:windows=3, auto), planned at THETA_PLAN
(default theta) with METHOD (default mixed).
"""

DEFAULT_POLICIES = ("mean:windows=1", "mean:windows=1@{quarter}", "robust:windows=3", "auto")


def add_subcommands(subparsers) -> None:
    """Add ``backtest`` to the ``rebalance`` command's subparsers."""
    p = subparsers.add_parser(
        "backtest", help="replay stored windows: do plans hold in the windows after them?",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("histograms", metavar="HISTOGRAMS",
                   help="Delta table directory, Parquet file/directory or CSV file with columns "
                        "window_start, key, count [, cost, state_bytes]")
    p.add_argument("--instances", required=True, type=int, metavar="N",
                   help="number of instances (>= 1)")
    p.add_argument("--theta", required=True, type=float, metavar="T",
                   help="imbalance bound: a judged window is within when max load <= "
                        "(1 + T) x mean")
    p.add_argument("--history", type=int, default=1, metavar="W",
                   help="windows each plan is made on, at least (default 1; a load model "
                        "that reads more gets what it reads)")
    p.add_argument("--horizon", type=int, default=1, metavar="K",
                   help="windows each plan is judged on (default 1)")
    p.add_argument("--policies", nargs="+", metavar="SPEC", default=None,
                   help="policies MODEL[@THETA_PLAN][/METHOD] (default: mean:windows=1, "
                        "mean:windows=1@T/4, robust:windows=3, auto)")
    p.add_argument("--start", type=int, default=None, metavar="S",
                   help="first step (window index; default: the most windows a policy needs)")
    p.add_argument("--step", type=int, default=1, metavar="S",
                   help="windows between plans (default 1)")
    p.add_argument("--assignment", metavar="PATH", default=None,
                   help="assignment before the first step (key, instance); default: the "
                        "default placement")
    p.add_argument("--oracle-windows", type=int, default=None, metavar="W",
                   help="windows after the judged one the distribution oracle plans on "
                        "(default 3)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write steps.csv, summary.csv and imbalance.png here")
    p.set_defaults(func=run_backtest)


def parse_policy(spec: str, theta: float, history: int):
    """A :class:`~rebalance.core.backtest.Policy` of ``MODEL[@THETA_PLAN][/METHOD]``."""
    from rebalance.cli import UserError
    from rebalance.core.backtest import Policy
    from rebalance.core.forecast import LoadModel, LoadModelError, history_needed
    from rebalance.core.planner_names import METHODS

    text, _, method = spec.partition("/")
    method = method.strip() or "mixed"
    if method not in METHODS:
        raise UserError(f"--policies {spec!r}: unknown method {method!r}; choose one of "
                        f"{', '.join(METHODS)}")
    model_text, at, tp_text = text.partition("@")
    theta_plan = None
    if at:
        try:
            theta_plan = float(tp_text)
        except ValueError:
            raise UserError(f"--policies {spec!r}: theta_plan {tp_text!r} is not a "
                            "number") from None
        if not (math.isfinite(theta_plan) and 0 < theta_plan):
            raise UserError(f"--policies {spec!r}: theta_plan must be > 0, got {tp_text}")
    try:
        model = LoadModel.parse(model_text)
    except LoadModelError as exc:
        raise UserError(f"--policies {spec!r}: {exc}") from None
    if model.name == "auto":
        return Policy(name="auto" if not at and method == "mixed" else spec, method=method,
                      load_model=model, theta_plan=theta_plan, history=history)
    return Policy(name=spec, method=method, load_model=model, theta_plan=theta_plan,
                  history=max(history, history_needed(model)))


def _check(args) -> None:
    from rebalance.cli import UserError
    from rebalance.core.model import MAX_INSTANCES

    if not 1 <= args.instances <= MAX_INSTANCES:
        raise UserError(f"--instances must be in [1, {MAX_INSTANCES}], got {args.instances}")
    if problem := theta_problem(args.theta, "--theta"):
        raise UserError(problem)
    for name in ("history", "horizon", "step"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.oracle_windows is not None and args.oracle_windows < 1:
        raise UserError(f"--oracle-windows must be >= 1, got {args.oracle_windows}")
    if args.start is not None and args.start < 1:
        raise UserError(f"--start must be >= 1, got {args.start}")
    if args.out is not None:
        from rebalance.cli.plan import check_out_dir

        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out} exists and is not a directory")
        check_out_dir(out)


def run_backtest(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(args)


def _initial(path, history):
    import numpy as np

    from rebalance.core.histogram_files import read_assignment_table
    from rebalance.core.histograms import check_assignment
    from rebalance.core.key_order import python_strings

    keys, inst = check_assignment(read_assignment_table(path), history.n_instances)
    names = python_strings(keys)
    if len(set(names.tolist())) != len(names):
        from rebalance.cli import UserError

        raise UserError(f"--assignment {path} lists a key twice")
    start = history.default.copy()
    pos = {k: i for i, k in enumerate(history.keys.tolist())}
    for k, d in zip(names.tolist(), inst.tolist()):
        i = pos.get(k)
        if i is not None:
            start[i] = d
    return np.asarray(start, dtype=np.int64)


def _run(args: argparse.Namespace) -> int:
    import pandas as pd

    from rebalance.core.backtest import ORACLE_WINDOWS, WindowHistory, backtest
    from rebalance.core.histogram_files import read_histogram_table

    _check(args)
    quarter = f"{args.theta / 4:g}"
    specs = args.policies or [s.format(quarter=quarter) for s in DEFAULT_POLICIES]
    policies = [parse_policy(s, args.theta, args.history) for s in specs]
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        from rebalance.cli import UserError

        raise UserError(f"--policies lists a policy twice: {names}")
    history = WindowHistory.from_histograms(read_histogram_table(args.histograms),
                                            args.instances)
    initial = None if args.assignment is None else _initial(args.assignment, history)
    result = backtest(history, policies, args.theta, horizon=args.horizon, start=args.start,
                      step=args.step, initial=initial,
                      oracle_windows=args.oracle_windows or ORACLE_WINDOWS)
    table = result.summary.drop(columns=["kind", "plan_seconds"])
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for note in result.notes:
        print(note)
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result.steps.to_csv(out / "steps.csv", index=False)
        result.summary.to_csv(out / "summary.csv", index=False)
        plot(result, out / "imbalance.png")
        print(f"wrote {out / 'steps.csv'}, {out / 'summary.csv'}, {out / 'imbalance.png'}")
    return 0


def plot(result, path: Path) -> None:
    """Realised imbalance of every policy and of the stay / oracle baselines per judged
    window, against 1 + theta."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result.steps
    best = result.row("distribution-oracle")["theta_plan"] if (
        "distribution-oracle" in set(result.summary["policy"])) else None
    shown = [p for p in result.summary["policy"] if not p.startswith("distribution-oracle")
             and p != "none"]
    if best is not None:
        shown.append(f"distribution-oracle@{best:g}")
    fig, ax = plt.subplots(figsize=(11, 5))
    for name in shown:
        rows = steps[steps["policy"] == name].drop_duplicates("window")
        ax.plot(rows["window_start"], rows["realised_imbalance"], lw=1, label=name)
    ax.axhline(1 + result.theta, color="black", ls="--", lw=1,
               label=f"1 + theta = {1 + result.theta:g}")
    ax.set_ylabel("realised imbalance (max / mean)")
    ax.set_xlabel("judged window")
    ax.set_title("Plans judged on the windows after them")
    ax.legend(fontsize=7, ncol=2)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
