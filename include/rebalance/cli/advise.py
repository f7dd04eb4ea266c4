"""``rebalance advise``: the theta a job can keep, from its stored windows.

    rebalance advise [HISTOGRAMS] --instances N [--theta T] [--target SHARE]
                     [--load-model MODEL] [--method METHOD] [--history W] [--thetas T ...]
                     [--out DIR]

Replays the job's windows (HISTOGRAMS, default the job's ``key_histograms`` table: under
``REBALANCE_DATA_DIR``, or ``rebalance --job NAME``'s) with the backtest at the job's theta
and at a grid of thetas (:mod:`rebalance.core.backtest.advise`), planning as the DAG does
by default, and prints whether plans keep theta, the smallest theta that holds, and what
plans gain over staying.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from rebalance.core.defaults import DEFAULT_THETA, theta_problem

HELP = """\
The theta a job can keep. Replays the job's stored windows (HISTOGRAMS: a Delta table
directory, a Parquet file or directory or a CSV file with window_start, key, count; default
the job's key_histograms table) at its theta and at a grid of thetas from 0.01 to 2, each
plan made as the DAG makes it and judged on the window after it, and prints:

  - whether plans keep theta: the share of following windows within 1 + theta
    against the target share (default 90 %);
  - the smallest theta whose plans keep the target share, and whether staying on the
    current assignment already keeps it;
  - at the job's theta: realised imbalance and state moved per plan against staying, and
    how much less the busiest instance carries (the job's critical path).
"""


def add_subcommands(subparsers) -> None:
    """Add ``advise`` to the ``rebalance`` command's subparsers (the DAG's defaults are
    read when the command runs: building the parser stays free of pandas)."""
    p = subparsers.add_parser("advise", help="the theta a job can keep, from its stored windows",
                              description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("histograms", metavar="HISTOGRAMS", nargs="?", default=None,
                   help="Delta table directory, Parquet file/directory or CSV file with columns "
                        "window_start, key, count [, cost, state_bytes] (default: the job's "
                        "key_histograms table under REBALANCE_DATA_DIR, or "
                        "rebalance --job NAME's)")
    p.add_argument("--instances", required=True, type=int, metavar="N",
                   help="number of instances (>= 1)")
    p.add_argument("--theta", type=float, default=DEFAULT_THETA, metavar="T",
                   help=f"the job's imbalance bound (default {DEFAULT_THETA:g})")
    p.add_argument("--target", type=float, default=None, metavar="SHARE",
                   help="share of the following windows a theta must keep, in (0, 1] "
                        "(default: the DAG's headroom_target)")
    p.add_argument("--load-model", default=None, metavar="MODEL",
                   help="load model the plans use (default: the DAG's)")
    p.add_argument("--method", default=None, metavar="METHOD",
                   help="planner (default: the DAG's)")
    p.add_argument("--history", type=int, default=None, metavar="W",
                   help="windows each plan is made on, at least (default: the DAG's "
                        "lookback_windows)")
    p.add_argument("--thetas", type=float, nargs="+", default=None, metavar="T",
                   help="the thetas to try besides --theta (default 0.01 to 2)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write advice.csv (one row per theta tried) here")
    p.set_defaults(func=run_advise)


def _with_defaults(args) -> None:
    """The options left unset take the DAG's defaults (:class:`RunParams`)."""
    from rebalance.control.params import RunParams

    defaults = RunParams()
    for name, value in (("target", defaults.headroom_target),
                        ("load_model", defaults.load_model), ("method", defaults.method),
                        ("history", defaults.lookback_windows)):
        if getattr(args, name) is None:
            setattr(args, name, value)


def _check(args) -> None:
    from rebalance.cli import UserError
    from rebalance.core.model import MAX_INSTANCES

    _with_defaults(args)

    if not 1 <= args.instances <= MAX_INSTANCES:
        raise UserError(f"--instances must be in [1, {MAX_INSTANCES}], got {args.instances}")
    if problem := theta_problem(args.theta, "--theta"):
        raise UserError(problem)
    if not 0 < args.target <= 1:
        raise UserError(f"--target must be a share in (0, 1], got {args.target:g}")
    if args.history < 1:
        raise UserError(f"--history must be >= 1, got {args.history}")
    for value in args.thetas or ():
        if problem := theta_problem(value, "--thetas"):
            raise UserError(problem)
    if args.out is not None:
        from rebalance.cli.plan import check_out_dir

        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out} exists and is not a directory")
        check_out_dir(out)


def default_histograms() -> Path:
    """The job's ``key_histograms`` table: under ``REBALANCE_DATA_DIR``, or with
    ``rebalance --job NAME`` in that job's tables."""
    from rebalance.spark.tables import KEY_HISTOGRAMS

    return Path(KEY_HISTOGRAMS.path())


def run_advise(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import pandas as pd

    from rebalance.cli.backtest import parse_policy
    from rebalance.control.decide import backtest_params
    from rebalance.control.params import RunParams
    from rebalance.core.backtest import WindowHistory
    from rebalance.core.backtest.advise import advise
    from rebalance.core.histogram_files import read_histogram_table

    _check(args)
    spec = args.load_model if args.method == "mixed" else f"{args.load_model}/{args.method}"
    policy = parse_policy(spec, args.theta, args.history)
    source = args.histograms or default_histograms()
    history = WindowHistory.from_histograms(read_histogram_table(source), args.instances)
    params = backtest_params(RunParams(theta=args.theta, method=args.method))
    advice = advise(history, args.theta, policy, target=args.target, thetas=args.thetas,
                    params=params)
    print(f"{history.n_windows} windows of {history.n_keys} keys from {source}, "
          f"N = {args.instances}; plans: {policy.name} (each judged on the window after it)")
    shown = advice.table.assign(
        share_within=lambda t: (100 * t.share_within).round().astype(int).astype(str) + " %",
        stay_share_within=lambda t: (100 * t.stay_share_within).round().astype(int)
        .astype(str) + " %",
        migration_per_step=lambda t: (100 * t.migration_per_step).map("{:.1f} %".format))
    shown.columns = ["theta", "plans within", "staying within", "imbalance", "staying",
                     "moved per plan", "plans", "windows judged"]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}".rstrip("0")
                              .rstrip(".")))
    for line in advice.lines():
        print(line)
    print(f"({len(advice.table)} thetas replayed in {advice.seconds:.1f} s)")
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        advice.table.to_csv(out / "advice.csv", index=False)
        print(f"wrote {out / 'advice.csv'}")
    return 0
