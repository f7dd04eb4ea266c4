"""``rebalance plan``'s load-model options: ``--load-model`` (default ``auto``),
``--theta-plan`` and ``--headroom-target``, and the problem they make.

:mod:`rebalance.cli.plan` parses them with :func:`add_plan_arguments` and
:func:`check_plan_arguments` and builds its problem with :func:`load_for_plan`. A single
window (the usual input of a big plan) never imports the backtest (nor pandas): nothing
can be backtested on one window.
"""

from __future__ import annotations

import math
from pathlib import Path


def add_plan_arguments(p) -> None:
    """``rebalance plan``'s load-model options."""
    p.add_argument("--load-model", default="auto", metavar="MODEL",
                   help="load model the plan is made for (default auto: chosen by backtest "
                        "over the windows given, see rebalance backtest): mean[:windows=W], "
                        "ewm:halflife=H, quantile:q=Q, max, seasonal:period=P, "
                        "robust[:windows=W][,period=P]; W defaults to --windows")
    p.add_argument("--theta-plan", type=float, default=None, metavar="T",
                   help="planning bound <= --theta (headroom for the windows after the plan); "
                        "default: chosen by auto, else --theta")
    p.add_argument("--headroom-target", type=float, default=None, metavar="SHARE",
                   help="share of backtested windows within 1 + theta that auto (or, with an "
                        "explicit --load-model, the calibration of theta_plan) aims at "
                        "(default 0.9 for auto; no calibration otherwise)")


def check_plan_arguments(args) -> None:
    """One line per bad load-model option of ``rebalance plan``."""
    from rebalance.cli import UserError
    from rebalance.core.forecast import LoadModel, LoadModelError

    try:
        args.load_model = LoadModel.parse(args.load_model)
    except LoadModelError as exc:
        raise UserError(f"--load-model: {exc}") from None
    tp = args.theta_plan
    if tp is not None and not (math.isfinite(tp) and 0 < tp <= args.theta):
        raise UserError(f"--theta-plan must be in (0, --theta = {args.theta:g}], got {tp}")
    target = args.headroom_target
    if target is not None and not (math.isfinite(target) and 0 < target <= 1):
        raise UserError(f"--headroom-target must be a share in (0, 1], got {target}")


def load_for_plan(args):
    """The problem ``rebalance plan`` plans, as :func:`rebalance.core.histograms.read_input` builds
    it, with the load model applied: (problem, summary, keys, theta_plan, load_model
    document for plan.json).

    ``mean`` over ``--windows`` with no theta_plan is today's problem unchanged. ``auto``
    backtests :func:`rebalance.core.backtest.choose`'s candidates over every window of the input
    from the current assignment and plans with the chosen model (or stays: the current
    assignment, when no candidate beats keeping it); one window cannot be backtested, so
    auto then plans on the mean of ``--windows`` at theta and says so."""
    import dataclasses

    import numpy as np

    from rebalance.core.forecast import forecast, history_needed, scenarios
    from rebalance.core.histogram_files import read_assignment_table, read_histogram_table
    from rebalance.core.histograms import MAX_SERIES_CELLS, read_input

    model = args.load_model
    theta = float(args.theta)
    given = args.windows
    if args.windows is None:
        args.windows = 1  # today's default; auto may choose more
    plain = model.name == "mean" and model.windows is None and args.headroom_target is None
    doc = {"requested": str(model), "theta": theta}
    if plain:
        problem, summary, keys = read_input(args.histograms, args.instances,
                                            assignment_path=args.assignment,
                                            windows=args.windows)
        tp = float(args.theta_plan or theta)
        doc.update(chosen=f"mean:windows={summary['windows_used']}", theta_plan=tp,
                   reason="load model given: the mean of the planned windows")
        args.windows = int(summary["windows_used"])
        return problem, summary, keys, tp, doc
    table = read_histogram_table(args.histograms)
    assignment = (None if args.assignment is None else read_assignment_table(args.assignment))
    n_windows = _distinct(table, "window_start") if model.name == "auto" else 2
    cells = n_windows * _distinct(table, "key") if n_windows >= 2 else 0
    if model.name == "auto" and (n_windows < 2 or cells > MAX_SERIES_CELLS):
        # nothing to backtest, or too much to replay: today's problem, built once
        why = ("1 window given: too few to backtest a plan on windows it has not seen" if
               n_windows < 2 else
               f"{n_windows} windows x {cells // n_windows} keys = {cells} cells are too many "
               f"to backtest (limit {MAX_SERIES_CELLS}); --load-model names a model to plan "
               "on without a backtest")
        problem, summary, keys = _problem(table, assignment, args.instances, args.windows)
        summary["histograms_format"] = _format(args.histograms)
        tp = float(args.theta_plan or theta)
        doc.update(chosen=f"mean:windows={summary['windows_used']}", theta_plan=tp,
                   stay=False, windows=int(summary["windows_used"]), windows_backtested=0
                   if n_windows >= 2 else 1,
                   target=0.9 if args.headroom_target is None else float(args.headroom_target),
                   reason=f"{why}; planned on the mean of the planned windows at theta_plan")
        args.windows = int(summary["windows_used"])
        return problem, summary, keys, tp, doc
    from rebalance.core.backtest import WindowHistory, calibrate, choose

    history = WindowHistory.from_histograms(table, args.instances)
    # the problem over every window: its current assignment is where the backtest starts
    full, _, _ = _problem(table, assignment, args.instances, history.n_windows)
    pos = np.searchsorted(full.keys.astype(str), history.keys.astype(str))
    initial = full.current[pos]
    chosen, tp, reason, candidates, stay = model, args.theta_plan, "", None, False
    target = 0.9 if args.headroom_target is None else float(args.headroom_target)
    if model.name == "auto":
        candidates = None
        if given is not None:  # the user's W: every model auto tries reads W windows
            from rebalance.core.backtest import default_candidates

            candidates = [dataclasses.replace(p, name="", history=given,
                                              load_model=p.load_model.with_windows(given))
                          for p in default_candidates(theta, history.n_windows,
                                                      loads=history.loads)
                          if p.load_model.name != "seasonal" or p.load_model.period <= given]
            candidates = list({p.name: p for p in candidates}.values())
        choice = choose(history, theta, time_limit=float(args.time_limit), target=target,
                        initial=initial, candidates=candidates)
        candidates = choice.table
        reason = choice.reason
        if not choice.backtested:  # planned as with one window: the mean at theta_plan
            chosen = dataclasses.replace(model, name="mean", windows=args.windows)
            reason += "; planned on the mean of the planned windows at theta_plan"
        elif choice.stay:
            stay = True
            chosen = dataclasses.replace(model, name="mean", windows=args.windows)
        else:
            chosen = choice.policy.load_model
            if tp is None:
                tp = choice.theta_plan
    elif args.headroom_target is not None and args.theta_plan is None:
        from rebalance.core.backtest import Policy

        cal = calibrate(history, Policy.of(model), theta, target=target, initial=initial)
        tp, reason, candidates = cal.theta_plan, cal.reason, cal.table
    tp = float(tp or theta)
    windows = chosen.windows if chosen.windows is not None else args.windows
    windows = max(int(windows), history_needed(chosen))
    if chosen.name == "seasonal":
        windows = max(windows, int(chosen.period))
    problem, summary, keys = _problem(table, assignment, args.instances, windows)
    del table
    summary["histograms_format"] = _format(args.histograms)
    series = problem.load_series
    if chosen.name != "mean" and series is not None:
        if series.shape[0] < history_needed(chosen):
            from rebalance.cli import UserError

            raise UserError(f"--load-model {chosen}: needs {history_needed(chosen)} windows, "
                            f"the input has {series.shape[0]}")
        load = forecast(series, chosen)
        sc = scenarios(series, chosen) if chosen.name == "robust" else None
        problem = dataclasses.replace(problem, load=load, scenarios=sc)
        summary["load"] = f"load model {chosen} over the planned windows"
    doc.update(chosen="stay" if stay else str(chosen), theta_plan=tp, stay=stay,
               reason=reason or "load model given", windows=int(summary["windows_used"]),
               windows_backtested=int(history.n_windows), target=target)
    if candidates is not None and len(candidates):
        doc["candidates"] = candidates.drop(columns=["kind"], errors="ignore").to_dict("records")
    args.windows = int(summary["windows_used"])
    return problem, summary, keys, tp, doc


def _problem(table, assignment, n, windows):
    from rebalance.core.histograms import _build

    return _build(table, n, assignment, windows)


def _format(path) -> str:
    from rebalance.core.histogram_files import is_delta

    return ("delta" if is_delta(Path(path)) else
            "csv" if str(path).lower().endswith(".csv") else "parquet")


def _distinct(table, column: str) -> int:
    """Distinct values of ``column`` in a histogram table (2 when it cannot tell: the full
    path then checks the column and says what is wrong)."""
    try:
        if hasattr(table, "column_names"):
            import pyarrow.compute as pc

            return len(pc.unique(table.column(column)))
        return int(table[column].nunique())
    except Exception:  # noqa: BLE001 - a missing or odd column is refused by the full path
        return 2
