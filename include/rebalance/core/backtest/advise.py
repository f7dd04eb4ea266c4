"""The theta a job can keep: its stored windows replayed at every theta of a grid.

A job's theta is a promise (every instance within 1 + theta of the mean load) that plans
can keep only when the workload allows it: a key heavier than (1 + theta) mean loads, or
loads that change more from one window to the next than a plan can follow, put it out of
reach. :func:`advise` backtests one policy (by default what the DAG runs) at each theta of
a grid and the job's own, and reports the smallest theta whose plans keep the target share
of the following windows within 1 + theta, and, at the job's theta, what plans gain over
staying on the current assignment. Definitions: ``docs/backtest.md``, "The theta a job
can keep".
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rebalance.core.backtest.engine import backtest, window_instance_loads
from rebalance.core.backtest.history import BacktestError, Policy, WindowHistory
from rebalance.core.defaults import theta_problem
from rebalance.core.model import PlanParams, imbalance

#: The thetas tried besides the job's own (the DAG's Params take theta in (0, 2]).
ADVISE_THETAS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
                 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0)
#: The share of judged windows a theta must keep by default.
ADVISE_TARGET = 0.9
#: Columns of :attr:`Advice.table`, one row per theta tried.
ADVICE_COLUMNS = ("theta", "share_within", "stay_share_within", "mean_imbalance",
                  "mean_stay_imbalance", "migration_per_step", "steps", "windows")


@dataclass(frozen=True)
class Advice:
    """What :func:`advise` found: per theta tried, the policy's backtest against staying
    (the assignment in force before the first plan, kept through every judged window)."""

    theta: float
    target: float
    policy: str
    table: pd.DataFrame
    seconds: float

    def _row(self, theta: float) -> pd.Series:
        return self.table.loc[np.isclose(self.table["theta"], theta)].iloc[0]

    @property
    def at_theta(self) -> pd.Series:
        """The job's theta's row."""
        return self._row(self.theta)

    @property
    def attainable(self) -> float | None:
        """The smallest theta tried whose plans keep the target share (None: none does)."""
        ok = self.table[self.table["share_within"] >= self.target - 1e-12]
        return float(ok["theta"].min()) if len(ok) else None

    @property
    def stay_attainable(self) -> float | None:
        """The smallest theta tried that staying alone keeps (None: none)."""
        ok = self.table[self.table["stay_share_within"] >= self.target - 1e-12]
        return float(ok["theta"].min()) if len(ok) else None

    @property
    def reachable(self) -> bool:
        """Whether plans keep the job's theta for the target share of windows."""
        return bool(self.at_theta["share_within"] >= self.target - 1e-12)

    @property
    def critical_path_gain(self) -> float:
        """How much less the busiest instance carries under the plans than staying, at the
        job's theta (mean over the judged windows of max/mean load; the mean load is the
        same either way): 0.05 is a 5 % shorter critical path, <= 0 none."""
        row = self.at_theta
        return 1.0 - float(row["mean_imbalance"]) / float(row["mean_stay_imbalance"])

    def lines(self) -> list[str]:
        """The advice in a user's words, one finding a line."""
        row, t = self.at_theta, self.theta
        out = []
        keep = (f"plans keep {row.share_within:.0%} of the following windows within "
                f"1 + theta = {1 + t:g} (target {self.target:.0%})")
        out.append(f"theta {t:g} holds: {keep}" if self.reachable
                   else f"theta {t:g} is out of reach: {keep}")
        best = self.attainable
        if best is None:
            worst = float(self.table["theta"].max())
            out.append(f"no theta up to {worst:g} holds: the windows change more than a plan "
                       "made on the windows before them can follow")
        elif not self.reachable or best < t:
            kept = self._row(best)
            out.append(f"the smallest theta that holds: {best:g} (plans keep "
                       f"{kept.share_within:.0%}, staying {kept.stay_share_within:.0%})")
        stay = self.stay_attainable
        if stay is not None and (best is None or stay <= best):
            out.append(f"staying on the current assignment already keeps theta {stay:g}: "
                       "from there on plans add nothing")
        out.append(f"at theta {t:g}: realised imbalance {row.mean_imbalance:.3f} against "
                   f"{row.mean_stay_imbalance:.3f} staying, {row.migration_per_step:.1%} of "
                   f"the state moved per plan")
        gain = self.critical_path_gain
        out.append(f"the busiest instance carries {gain:.1%} less than staying (critical "
                   "path)" if gain > 0.0005 else
                   "the busiest instance carries no less than staying: plans do not pay here")
        return out


def advise(history: WindowHistory, theta: float, policy: Policy, target: float = ADVISE_TARGET,
           thetas: Sequence[float] | None = None, horizon: int = 1,
           params: PlanParams | None = None, initial: np.ndarray | None = None,
           until_one_holds: bool = False) -> Advice:
    """Backtest ``policy`` over ``history`` from ``initial`` at ``theta`` and at each of
    ``thetas`` (default :data:`ADVISE_THETAS`), each plan judged on the ``horizon``
    windows after it against staying (:func:`~rebalance.core.backtest.backtest`).

    ``until_one_holds`` (the DAG's cheap question): ``theta`` first, then the larger
    thetas in increasing order, stopping at the first that holds; the table then has only
    the thetas tried."""
    if problem := theta_problem(theta):
        raise BacktestError(problem)
    if isinstance(target, bool) or not isinstance(target, (int, float)) \
            or not 0 < target <= 1:
        raise BacktestError(f"target share must be in (0, 1], got {target!r}")
    grid = list(ADVISE_THETAS if thetas is None else thetas)
    for value in grid:
        if problem := theta_problem(value, "a theta to try"):
            raise BacktestError(problem)
    if history.n_windows <= policy.history:
        raise BacktestError(f"{history.n_windows} window(s) stored: policy {policy.name} plans "
                            f"on {policy.history}, none is left to judge a plan on")
    t0 = time.perf_counter()
    current = history.default if initial is None else np.asarray(initial, dtype=np.int64)
    rows = []
    order = sorted({round(float(v), 12) for v in [*grid, theta]})
    if until_one_holds:
        order = [round(float(theta), 12)] + [v for v in order if v > theta]
    for value in order:
        result = backtest(history, [policy], value, horizon=horizon, baselines=(),
                          params=params, initial=current)
        mine = result.row(policy.name)
        judged = result.steps.loc[result.steps["policy"] == policy.name, "window"].to_numpy()
        stay = imbalance(window_instance_loads(history.loads[judged.astype(int)], current,
                                               history.n_instances))
        rows.append((value, float(mine.share_within),
                     float(np.mean(stay <= 1 + value + 1e-12)) if len(stay) else math.nan,
                     float(mine.mean_imbalance),
                     float(stay.mean()) if len(stay) else math.nan,
                     float(mine.migration_per_step), int(mine.steps), int(mine.windows)))
        if until_one_holds and rows[-1][1] >= target - 1e-12:
            break
    table = pd.DataFrame(rows, columns=list(ADVICE_COLUMNS)).sort_values(
        "theta", ignore_index=True)
    if table["windows"].max() == 0 or math.isnan(float(table["share_within"].iloc[0])):
        raise BacktestError("no window was judged: store more windows")
    return Advice(float(theta), float(target), policy.name, table, time.perf_counter() - t0)
