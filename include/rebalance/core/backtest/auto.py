"""How ``auto`` picks among backtested candidates (:mod:`rebalance.core.backtest`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from rebalance.core.backtest.history import Policy
from rebalance.core.forecast import LoadModel, detect_period, history_needed

# ------------------------------------------------------------------ auto
#: Load models auto tries (with W = what each reads); seasonal ones are added when the
#: history holds two periods (see :func:`default_candidates`).
AUTO_MODELS = ("mean:windows=1", "ewm:halflife=2,windows=8", "robust:windows=3",
               "robust:windows=7", "robust:windows=14")
#: theta_plan values auto tries, as fractions of theta.
AUTO_HEADROOM = (1.0, 0.5)
#: How far below the best backtested share within 1 + theta a candidate may be and still be
#: chosen for migrating less (:func:`_pick`).
AUTO_SHARE_SLACK = 0.05
#: How far above the lowest backtested mean imbalance (as a fraction of theta) a candidate
#: near the best share may be and still be chosen for migrating less (:func:`_pick`).
AUTO_MEAN_TOLERANCE = 1 / 8
#: Seasonal periods (windows) auto tries when the history holds two of them, beside the
#: period detected in the windows themselves (:func:`rebalance.core.forecast.detect_period`).
AUTO_PERIODS = (7, 24)
#: How many periods back a seasonal candidate reads the same slot, for the period detected
#: in the windows (:func:`rebalance.core.forecast.detect_period`): one period back carries
#: one window's noise, the mean of the same slot over 2 or 4 periods less; and over 2 or 4
#: periods, a robust candidate keeps each of those slots within the bound (kept where the
#: windows hold twice that many periods). The periods of :data:`AUTO_PERIODS` the windows
#: do not show get one period back only.
AUTO_SEASONS = (1, 2, 4)



@dataclass(frozen=True)
class AutoSettings:
    """How a backtest's ``auto`` policy chooses at every step (:func:`~rebalance.core.backtest.
    backtest`'s ``auto_settings``). The defaults are what ``rebalance backtest`` and the DAG use;
    the backtest benchmark's ``--sensitivity`` varies them.

    * ``lookback``: at most this many judged windows before a step are compared (56);
    * ``min_evidence``: with fewer judged windows, auto does what the stay baseline does (7);
    * ``target``: the share of judged windows within 1 + theta :func:`_pick` aims at (0.9);
    * ``min_gain``: a chosen candidate's plans must beat not replanning by this much of mean
      realised imbalance (0);
    * ``headroom``: the default candidates' fractions of theta (:data:`AUTO_HEADROOM`);
    * ``share_slack``, ``mean_tolerance``: :func:`_pick`'s (:data:`AUTO_SHARE_SLACK`,
      :data:`AUTO_MEAN_TOLERANCE`);
    * ``candidates``: the candidates themselves instead of :func:`default_candidates`.
    """

    lookback: int = 56
    min_evidence: int = 7
    target: float = 0.9
    min_gain: float = 0.0
    headroom: Sequence[float] = AUTO_HEADROOM
    share_slack: float = AUTO_SHARE_SLACK
    mean_tolerance: float = AUTO_MEAN_TOLERANCE
    candidates: Sequence[Policy] | None = None


def default_candidates(theta: float, n_windows: int, n_keys: int | None = None,
                       method: str = "mixed", loads=None,
                       headroom: Sequence[float] = AUTO_HEADROOM) -> list[Policy]:
    """The policies auto compares: :data:`AUTO_MODELS` whose history leaves at least half
    of ``n_windows`` to judge on (and seasonal models per period of
    :data:`AUTO_PERIODS`, and the period detected in ``loads`` (W x K, the windows before
    the choice), that the windows cover twice; for the detected period, the same slot
    averaged over, and robust over, each number of periods of :data:`AUTO_SEASONS` the
    windows hold twice), each at every fraction of theta in ``headroom``."""
    models = [LoadModel.parse(m) for m in AUTO_MODELS]
    periods = list(AUTO_PERIODS)
    found = None if loads is None else detect_period(loads)
    if found is not None and found not in periods:
        periods.append(found)
    for p in periods:
        # several periods back only for a period the windows themselves show
        for k in AUTO_SEASONS if p == found else AUTO_SEASONS[:1]:
            if n_windows >= 2 * k * p + 2:
                models.append(LoadModel("seasonal", windows=k * p, period=p))
                if k > 1:   # one slot alone is the seasonal candidate's single scenario
                    models.append(LoadModel("robust", windows=k * p, period=p))
    out = []
    for m in models:
        need = history_needed(m)
        if need > 1 and need > n_windows // 2:
            continue
        for f in headroom:
            out.append(Policy.of(m, theta_plan=None if f == 1.0 else theta * f, method=method))
    return out


MAX_MIGRATION_RATIO = 1.5


def _today(policies: Sequence[Policy], theta: float) -> int | None:
    """Index of today's planning (mean of the last window, at theta) among ``policies``."""
    for i, p in enumerate(policies):
        m = p.load_model
        if (m.name == "mean" and m.windows == 1 and p.method == "mixed"
                and (p.theta_plan is None or abs(p.theta_plan - theta) <= 1e-12)):
            return i
    return None


def _pick(table: pd.DataFrame, stay_mean: float, theta: float, target: float,
          share_slack: float = AUTO_SHARE_SLACK, min_gain: float = 0.0,
          migration_cap: float | None = None,
          mean_tolerance: float = AUTO_MEAN_TOLERANCE,
          described: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """Index of the chosen candidate row (None: stay) and why (a candidate named by
    ``described[policy]``, its :meth:`Policy.describe`, when given).

    Candidates whose share within 1 + theta reaches ``target`` are near-best, else
    those within ``share_slack`` of the best share and within ``mean_tolerance`` x theta
    of the lowest mean imbalance among them; of those the least migration wins (ties:
    lower mean imbalance). The choice stands only if its mean realised imbalance beats staying's by
    ``min_gain``. Candidates migrating more than ``migration_cap`` per step are left out
    (unless that leaves none)."""
    if table.empty:
        return None, "no candidate could be backtested"
    capped = ""
    if migration_cap is not None:
        cheap = table[table["migration_per_step"] <= migration_cap + 1e-12]
        if len(cheap) < len(table):
            capped = (f"; {len(table) - len(cheap)} candidate(s) migrating more than "
                      f"{migration_cap:.2%} per step ({MAX_MIGRATION_RATIO:g}x today's "
                      "planning) left out")
        table = cheap if len(cheap) else table
    best_share = float(table["share_within"].max())
    reach = table[table["share_within"] >= target - 1e-12]
    if len(reach):
        near = reach
    else:
        near = table[table["share_within"] >= best_share - share_slack - 1e-12]
        lowest = float(near["mean_imbalance"].min())
        near = near[near["mean_imbalance"] <= lowest + theta * mean_tolerance]
    row = near.sort_values(["migration_per_step", "mean_imbalance"], kind="stable").iloc[0]
    idx = int(row.name)
    what = (described or {}).get(row.policy, row.policy)
    if math.isfinite(stay_mean) and not row.mean_imbalance < stay_mean - min_gain:
        return None, (f"plans made on these windows do not hold: backtested realised "
                      f"{row.mean_imbalance:.3f} (best: {what}) vs {stay_mean:.3f} staying")
    versus = f" vs {stay_mean:.3f} staying" if math.isfinite(stay_mean) else ""
    return idx, (f"{what}: {row.share_within:.0%} of {int(row.windows)} backtested windows "
                 f"within 1 + theta = {1 + theta:g} (best candidate {best_share:.0%}), mean "
                 f"realised {row.mean_imbalance:.3f}{versus}, migration "
                 f"{row.migration_per_step:.2%} per step{capped}")
