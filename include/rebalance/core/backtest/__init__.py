"""Backtest: do plans hold in the windows that follow them? (issue 19)

A plan is made from the windows before it and lives in the windows after it. The backtest
replays stored windows: at each step t a policy plans on the windows [t - W, t) from its
own current assignment (chained from its previous step; the first step starts from the
default placement or a given assignment), and the plan is judged on the next ``horizon``
windows [t, t + horizon) it has not seen:

* realised imbalance of a judged window = max instance load / mean load over the N
  instances under the plan; ``within`` = realised <= 1 + theta;
* ``stay_imbalance``: what the policy's previous assignment would have given on the same
  window (the gain of planning at this step);
* migration of a step = state of the moved keys (state summed over the planning windows,
  as :func:`rebalance.core.histograms.build_problem` plans it) / total state of those windows.

Baselines (:data:`BASELINES`):

* ``none``: the default placement, never a plan;
* ``stay``: one plan at the first step (mean of the last window, at theta), never again;
* ``oracle``: a plan made on the judged window itself, at theta (sees the window's noise);
* ``distribution-oracle``: a plan made on the mean of the ``oracle_windows`` windows
  *after* the judged one (it knows where the load goes, not the judged window's noise),
  at each theta_plan of a grid; rows ``distribution-oracle@<theta_plan>`` per point and
  ``distribution-oracle`` for the best (highest share within, then lowest mean). The last
  window has no window after it: there the windows before it stand in. Each plan starts
  from the oracle's plan for a window at least ``oracle_windows + 1`` earlier, made on
  windows before the judged one (the plan for the window just before was made on windows
  that include the judged one).

On top: :func:`calibrate` (the planning bound theta_plan <= theta that makes plans hold),
:func:`choose` (what the ``auto`` load model does: a load model and theta_plan chosen by
backtest, never worse than staying) and :func:`holds` (the gate of the DAG: does a plan
made on these windows beat staying on held-out windows?).

Pure numpy/pandas (no Spark, no Airflow); deterministic for the same input. Plans use the
planners' search only (:meth:`Planner.propose`), not their lower bounds, so that hundreds
of plans take seconds.
"""

from rebalance.core.backtest.auto import (
    AUTO_HEADROOM,
    AUTO_MODELS,
    AUTO_PERIODS,
    AUTO_SEASONS,
    MAX_MIGRATION_RATIO,
    default_candidates,
)
from rebalance.core.backtest.engine import (
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
    BacktestResult,
    backtest,
    given_forecasts,
    headroom_grid,
    window_imbalance,
)
from rebalance.core.backtest.gate import Calibration, Choice, Holdout, calibrate, choose, holds
from rebalance.core.backtest.history import (
    BACKTEST_TIME_LIMIT,
    BASELINES,
    HEADROOM_FRACTIONS,
    ORACLE_WINDOWS,
    BacktestError,
    Policy,
    WindowHistory,
)
from rebalance.core.forecast import LoadModelError
from rebalance.core.model import PlanningError

__all__ = ["AUTO_HEADROOM", "AUTO_MODELS", "AUTO_PERIODS", "AUTO_SEASONS",
           "BACKTEST_TIME_LIMIT", "BASELINES",
           "HEADROOM_FRACTIONS", "MAX_MIGRATION_RATIO", "ORACLE_WINDOWS", "STEP_COLUMNS",
           "SUMMARY_COLUMNS", "BacktestError", "BacktestResult", "Calibration", "Choice",
           "Holdout", "LoadModelError", "PlanningError", "Policy", "WindowHistory", "backtest",
           "calibrate", "choose", "default_candidates", "given_forecasts", "headroom_grid", "holds",
           "window_imbalance"]
