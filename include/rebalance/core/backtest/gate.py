"""Calibration, the ``auto`` choice and the DAG's holdout gate (:mod:`rebalance.core.backtest`)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rebalance.core.backtest.auto import MAX_MIGRATION_RATIO, _pick, _today, default_candidates
from rebalance.core.backtest.engine import (
    SUMMARY_COLUMNS,
    _best,
    _Engine,
    backtest,
    headroom_grid,
    window_instance_loads,
)
from rebalance.core.backtest.history import BacktestError, Policy, WindowHistory
from rebalance.core.model import PlanParams, imbalance


# ------------------------------------------------------------------ calibration
@dataclass
class Calibration:
    """The planning bound chosen for a policy and the backtest behind it."""

    theta_plan: float
    share_within: float
    mean_imbalance: float
    migration_per_step: float
    table: pd.DataFrame
    reason: str


def calibrate(history: WindowHistory, policy: Policy, theta: float, target: float = 0.9,
              grid: Sequence[float] | None = None, horizon: int = 1, start: int | None = None,
              params: PlanParams | None = None,
              initial: np.ndarray | None = None) -> Calibration:
    """Choose theta_plan <= theta for ``policy`` from its backtest on ``history``: the
    largest realised share within 1 + theta reaching ``target`` at the least migration,
    else the best share (ties: lower mean imbalance, then less migration)."""
    if not (isinstance(target, (int, float)) and 0 < target <= 1):
        raise BacktestError(f"target share must be in (0, 1], got {target!r}")
    points = [dataclasses.replace(policy, name=f"theta_plan={tp:g}", theta_plan=tp)
              for tp in headroom_grid(theta, grid)]
    result = backtest(history, points, theta, horizon=horizon, start=start, baselines=(),
                      params=params, initial=initial)
    table = result.summary.copy()
    reach = table[table["share_within"] >= target - 1e-12]
    if len(reach):
        row = reach.sort_values(["migration_per_step", "theta_plan"],
                                ascending=[True, False], kind="stable").iloc[0]
        reason = (f"theta_plan {row.theta_plan:g} keeps {row.share_within:.0%} of "
                  f"{int(row.windows)} backtested windows within 1 + theta = {1 + theta:g} "
                  f"(target {target:.0%}) at the least migration of the "
                  f"{len(reach)} point(s) that reach it ({row.migration_per_step:.2%} per step)")
    else:
        best = _best(table.to_dict("records"))
        row = table[table["policy"] == best["policy"]].iloc[0]
        reason = (f"no theta_plan reaches the target {target:.0%}: theta_plan "
                  f"{row.theta_plan:g} keeps the most, {row.share_within:.0%} of "
                  f"{int(row.windows)} backtested windows within 1 + theta = {1 + theta:g} "
                  f"(mean realised {row.mean_imbalance:.3f})")
    return Calibration(float(row.theta_plan), float(row.share_within), float(row.mean_imbalance),
                       float(row.migration_per_step), table, reason)


@dataclass
class Choice:
    """What ``auto`` chose and why: ``policy`` (None: stay, plan nothing), ``theta_plan``,
    ``reason`` and the candidates' backtest ``table``. ``backtested`` False: the windows
    were too few to judge any candidate on windows it had not seen, so nothing was chosen
    (``policy`` None, and not a decision to stay)."""

    policy: Policy | None
    theta_plan: float
    reason: str
    table: pd.DataFrame
    stay_imbalance: float = math.nan
    backtested: bool = True

    @property
    def stay(self) -> bool:
        return self.policy is None and self.backtested


#: auto's migration per step at most this multiple of today's planning (mean of the last
#: window at theta) over the same windows, when today's planning is among the candidates.


def choose(history: WindowHistory, theta: float, time_limit: float = 30.0, target: float = 0.9,
           candidates: Sequence[Policy] | None = None, params: PlanParams | None = None,
           initial: np.ndarray | None = None, min_gain: float = 0.0) -> Choice:
    """What the ``auto`` load model does: backtest ``candidates`` (default
    :func:`default_candidates`) over ``history`` from ``initial``, within ``time_limit``
    seconds (candidates left when it runs out are not tried, and the reason says so), and
    pick one (:func:`_pick`); stay (``policy`` None) when none beats keeping ``initial``
    over the same windows by ``min_gain``."""
    h = history
    cands = list(candidates) if candidates is not None else default_candidates(
        theta, h.n_windows, h.n_keys, loads=h.loads)
    too_few = Choice(None, theta, f"{h.n_windows} window(s) given: too few to backtest a plan "
                     "on windows it has not seen", pd.DataFrame(columns=list(SUMMARY_COLUMNS)),
                     backtested=False)
    if h.n_windows < 2 or not cands:
        return too_few
    start_a = h.default.copy() if initial is None else np.asarray(initial, dtype=np.int64)
    need, least = max(p.history for p in cands), min(p.history for p in cands)
    start = min(need, h.n_windows - 1)
    cands = [p for p in cands if p.history <= start]
    if not cands:  # each candidate reads every window given: none is left to judge on
        too_few.reason = (f"{h.n_windows} window(s) given and every candidate plans on "
                          f"{least}: none is left to backtest a plan on windows it has not "
                          "seen")
        return too_few
    t0 = time.perf_counter()
    rows, skipped = [], 0
    for p in cands:
        if time.perf_counter() - t0 > time_limit:
            skipped += 1
            continue
        r = backtest(h, [p], theta, start=start, baselines=(), params=params, initial=start_a)
        rows.append(r.summary.iloc[0].to_dict())
    table = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    judged = h.loads[start:]
    stay_mean = float(imbalance(window_instance_loads(judged, start_a, h.n_instances)).mean())
    today = _today([p for p in cands if p.name in set(table["policy"])], theta)
    cap = None
    if today is not None:
        tried = [p for p in cands if p.name in set(table["policy"])]
        cap = MAX_MIGRATION_RATIO * float(
            table.loc[table["policy"] == tried[today].name, "migration_per_step"].iloc[0])
    idx, reason = _pick(table, stay_mean, theta, target, min_gain=min_gain, migration_cap=cap,
                        described={p.name: p.describe() for p in cands})
    if skipped:
        reason += f" ({skipped} candidate(s) not tried: time limit {time_limit:g} s)"
    chosen = None if idx is None else next(p for p in cands if p.name == table.loc[idx, "policy"])
    tp = theta if chosen is None else float(chosen.theta_plan or theta)
    return Choice(chosen, tp, reason, table, stay_mean)


# ------------------------------------------------------------------ the DAG gate
@dataclass
class Holdout:
    """A plan made before the held-out windows, judged on them against staying."""

    plan_imbalance: float
    stay_imbalance: float
    windows: int
    holds: bool
    reason: str
    min_gain: float = 0.0
    rows: pd.DataFrame | None = None


def holds(history: WindowHistory, policy: Policy, theta: float, holdout: int = 1,
          current: np.ndarray | None = None, min_gain: float = 0.0,
          params: PlanParams | None = None) -> Holdout:
    """Plan with ``policy`` on the windows before the last ``holdout`` windows (from
    ``current``, default: the default placement) and judge that plan and ``current`` on
    the held-out windows: the plan holds when its mean realised imbalance beats staying's
    by more than ``min_gain``."""
    h = history
    if isinstance(holdout, bool) or not isinstance(holdout, (int, np.integer)) or holdout < 1:
        raise BacktestError(f"holdout must be an integer >= 1 windows, got {holdout!r}")
    if policy.load_model.name == "auto":
        raise BacktestError("holds needs a concrete load model, not auto (choose one first)")
    cut = h.n_windows - int(holdout)
    if cut < policy.history:
        raise BacktestError(f"{h.n_windows} window(s) are too few: policy {policy.name} plans "
                            f"on {policy.history} and {holdout} are held out")
    cur = h.default.copy() if current is None else np.asarray(current, dtype=np.int64)
    eng = _Engine(h, theta, params)
    w = policy.history
    new, pred, mig, moved, _ = eng.plan(cur, h.loads[cut - w:cut], h.state[cut - w:cut].sum(0),
                                        policy.load_model, policy.theta_plan, policy.method)
    judged = h.loads[cut:]
    plan_r = imbalance(window_instance_loads(judged, new, h.n_instances))
    stay_r = imbalance(window_instance_loads(judged, cur, h.n_instances))
    p, s = float(plan_r.mean()), float(stay_r.mean())
    ok = p < s - min_gain
    verdict = "hold" if ok else "do not hold"
    reason = (f"plans made on these windows {verdict}: backtested realised {p:.2f} vs "
              f"{s:.2f} staying over {holdout} held-out window(s)")
    if abs(p - s) < 0.005:
        reason = reason.replace(f"{p:.2f} vs {s:.2f}", f"{p:.4f} vs {s:.4f}")
    rows = pd.DataFrame({"window_start": h.window_starts[cut:], "plan_imbalance": plan_r,
                         "stay_imbalance": stay_r})
    return Holdout(p, s, int(holdout), bool(ok), reason, float(min_gain), rows)
