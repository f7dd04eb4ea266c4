"""Backtest: do plans hold in the windows that follow them?

The backtest replays stored windows: at each step t a policy plans on the windows
[t - W, t), starting from its own previous assignment, and the plan is judged on the next
``horizon`` windows it has not seen (realised imbalance, ``within`` 1 + theta, what staying
would have given, migration), next to the :data:`BASELINES` ``none``, ``stay``, ``oracle``
and ``distribution-oracle``. On top: :func:`calibrate` (the planning bound theta_plan <=
theta that makes plans hold), :func:`choose` (the ``auto`` load model: chosen by backtest,
never worse than staying) and :func:`holds` (the DAG's gate: does a plan made on these
windows beat staying on held-out windows?).

Pure numpy/pandas, deterministic for the same input. Plans use the planners' search only
(:meth:`Planner.propose`), not their lower bounds, so that hundreds of plans take seconds.
Every definition and baseline: ``docs/planning.md``, "Plans that hold".
"""

from rebalance.core.backtest.auto import (
    AUTO_HEADROOM,
    AUTO_MODELS,
    AUTO_PERIODS,
    AUTO_SEASONS,
    MAX_MIGRATION_RATIO,
    AutoSettings,
    default_candidates,
)
from rebalance.core.backtest.engine import (
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
    BacktestResult,
    backtest,
    given_forecasts,
    headroom_grid,
    window_instance_loads,
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
           "AutoSettings", "BACKTEST_TIME_LIMIT", "BASELINES",
           "HEADROOM_FRACTIONS", "MAX_MIGRATION_RATIO", "ORACLE_WINDOWS", "STEP_COLUMNS",
           "SUMMARY_COLUMNS", "BacktestError", "BacktestResult", "Calibration", "Choice",
           "Holdout", "LoadModelError", "PlanningError", "Policy", "WindowHistory", "backtest",
           "calibrate", "choose", "default_candidates", "given_forecasts", "headroom_grid", "holds",
           "window_instance_loads"]
