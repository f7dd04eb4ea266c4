"""What a run decides from its windows, without Spark: whether to plan, how, and whether
the plan holds.

The ``rebalance`` DAG's ``detect`` and ``plan`` tasks hand the pinned windows here as a
:class:`~rebalance.core.backtest.WindowHistory` with the live assignment of its keys:
:func:`detect` applies the run's trigger rule, :func:`plan_policy` chooses the load model
and ``theta_plan`` on the windows before a held-out third and backtests the plan on that
third (:class:`~rebalance.core.trigger.GainGate`), and :func:`forecast_problem` builds the
problem that is planned. numpy/pandas only, unit-tested without Spark or Airflow. The rules
and the gate: ``docs/planning.md``, "What a DAG run decides".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rebalance.control.params import RunParams
from rebalance.core.backtest import (
    BACKTEST_TIME_LIMIT,
    BacktestError,
    Policy,
    WindowHistory,
    calibrate,
    choose,
    default_candidates,
    holds,
    window_instance_loads,
)
from rebalance.core.backtest.advise import advise
from rebalance.core.forecast import LoadModel, LoadModelError, forecast, scenarios
from rebalance.core.model import PlanParams, Problem, imbalance
from rebalance.core.trigger import Decision, GainGate, ThetaTrigger, TriggerPolicy, mldc


def holdout_windows(n_windows: int) -> int:
    """Windows held out to judge a plan: the latest third, at least one (6 -> 2, 3 -> 1)."""
    return max(1, int(n_windows) // 3)


# ---------------------------------------------------------------------- detect
def detect(history: WindowHistory, current: np.ndarray, p: RunParams, events: int,
           periods_since_last: int | None) -> tuple[Decision, dict[str, Any]]:
    """The trigger decision of the run's ``trigger_rule`` and what it looked at.

    ``current``: the live assignment of ``history.keys``. The facts (JSON-able) name the
    rule, the imbalance of every window under the live assignment and that of their
    mean load (the MLDC paper's MLDC is that minus 1).
    """
    per_window = imbalance(window_instance_loads(history.loads, current, history.n_instances))
    mean_imb = float(imbalance(window_instance_loads(history.loads.mean(axis=0), current,
                                                     history.n_instances))[0])
    if p.trigger_rule == "mldc":
        # rules 1-3 now; rule 4 needs the candidate plan and is checked by the plan task
        rules = dataclasses.replace(TriggerPolicy(min_items=int(p.min_events)),
                                    min_improvement=0.0)
        decision = rules.decide(mean_imb, int(events), periods_since_last,
                                predicted_imbalance=1.0, force=p.force)
    else:
        decision = ThetaTrigger(theta=p.theta).decide(per_window, force=p.force)
    facts = {"rule": p.trigger_rule, "imbalance": round(mean_imb, 6),
             "mldc": round(mldc(mean_imb), 6),
             "window_imbalance": [round(float(v), 6) for v in per_window],
             "bound": 1 + p.theta, "events": int(events),
             "periods_since_last_plan": periods_since_last, "decision": str(decision)}
    return decision, facts


def plan_summary(metrics: Mapping[str, Any], theta_plan: float) -> str:
    """What a plan does, in a user's words: the first of its reasons (the planner's own
    account of how it got there is kept apart, in ``inputs["planner_notes"]``)."""
    moved = int(metrics["moved_keys"])
    text = (f"moves {moved} key(s) ({100 * float(metrics['migration_fraction']):.1f}% of the "
            f"state)" if moved else "moves no key")
    if metrics.get("split_keys"):
        text += f"; {int(metrics['split_keys'])} hot key(s) split over several instances"
    text += (f"; routing table {int(metrics['table_size'])} entries; imbalance "
             f"{float(metrics['imbalance_before']):.3f} -> {float(metrics['imbalance_after']):.3f}"
             " predicted")
    if metrics.get("feasible") is False:
        text += (f", above the bound it was planned for (1 + {theta_plan:g}) or outside a "
                 "limit: the best the planner found")
    return text


def rule_text(rule: str) -> str:
    """How a skip names the rule that blocked, and how to plan anyway."""
    return ("theta trigger" if rule == "theta" else "MLDC trigger rules") \
        + "; set force to plan anyway"


# ---------------------------------------------------------------------- plan
@dataclass
class Planning:
    """How the run's plan is made and whether it holds (:func:`plan_policy`)."""

    load_model: LoadModel | None        # None: skipped before a model was chosen
    theta_plan: float
    decision: Decision                  # trigger: plan; else the reasons it is skipped
    reasons: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def skip(self) -> bool:
        return not self.decision.trigger


def _policy(model: LoadModel, theta_plan: float | None, method: str, before: int) -> Policy:
    """The policy that plans with ``model`` on the ``before`` windows ahead of the held-out
    ones (a model reading every window given reads all of those)."""
    if model.windows is None and model.name != "seasonal":
        model = model.with_windows(before)
    return Policy.of(model, theta_plan=theta_plan, method=method)


def backtest_params(p: RunParams) -> PlanParams:
    """Planner parameters of the plans a backtest makes: the run's theta and table bound,
    :data:`~rebalance.core.backtest.BACKTEST_TIME_LIMIT` per plan. Not its migration budget:
    the run's budget is a share of the state held at the latest window, while a backtest
    step's state is what its planning windows held; the plan that is stored keeps it."""
    return PlanParams(theta=float(p.theta), max_table=p.max_table,
                      time_limit=BACKTEST_TIME_LIMIT)


def plan_policy(history: WindowHistory, current: np.ndarray, p: RunParams,
                time_limit: float) -> Planning:
    """Choose the load model and ``theta_plan`` and judge the plan on held-out windows
    (module docstring); ``auto`` chooses within ``time_limit`` seconds (the planner's)."""
    params = backtest_params(p)
    theta, n = float(p.theta), history.n_windows
    reasons: list[str] = []
    facts: dict[str, Any] = {"windows": n}
    if n < 2:
        why = (f"not enough windows yet: {n} of 2 needed to judge a plan on a window it was "
               "not made on (min_windows >= 2 lets every run backtest)")
        model = LoadModel("mean") if p.model().name == "auto" else p.model()
        tp = float(p.theta_plan or theta)
        if not p.force:
            return Planning(None, tp, Decision(False, [why]), [why], facts)
        return Planning(model, tp, Decision(True, [why], forced=True),
                        [f"not backtested (forced): {why}"], facts)
    hold = holdout_windows(n)
    cut = n - hold
    before = history.slice(0, cut)
    facts.update(holdout=hold, held_out=[str(w) for w in history.window_starts[cut:]])
    model, tp = _choose(before, current, p, params, time_limit, reasons, facts)
    if model is None:  # auto found that no plan made on these windows beats staying
        why = reasons[-1]
        if not p.force:
            return Planning(None, theta, Decision(False, [why]), reasons, facts)
        model = LoadModel("mean")
        reasons.append(f"forced: planned on the mean of the {n} windows at theta_plan "
                       f"{tp:g}")
    policy = _policy(model, tp, p.method, cut)
    if policy.history > cut:
        why = (f"not enough windows yet: {n} of {policy.history + hold} needed (planning on "
               f"{model.describe()} reads {policy.history}, and {hold} are held out to judge "
               "the plan)")
        decision = Decision(True, [why], forced=True) if p.force else Decision(False, [why])
        return Planning(model, tp, decision, [*reasons, why], facts)
    held = holds(history, policy, theta, holdout=hold, current=current,
                 min_gain=p.min_backtest_gain, params=params)
    facts.update(planned=held.plan_imbalance, staying=held.stay_imbalance,
                 gain=held.stay_imbalance - held.plan_imbalance,
                 window_rows=[{"window_start": str(r.window_start),
                               "planned": float(r.plan_imbalance),
                               "staying": float(r.stay_imbalance)}
                              for r in held.rows.itertuples()])
    _theta_in_reach(history, policy, p, params, current, reasons, facts)
    decision = GainGate(min_gain=p.min_backtest_gain).decide(
        held.plan_imbalance, held.stay_imbalance, hold, force=p.force)
    reasons.append(str(decision) if decision.trigger and not decision.forced
                   else "; ".join(decision.reasons))
    return Planning(model, tp, decision, reasons, facts)


def _theta_in_reach(history: WindowHistory, policy: Policy, p: RunParams, params: PlanParams,
                    current: np.ndarray, reasons: list[str], facts: dict[str, Any]) -> None:
    """The smallest theta that plans made this way keep on the run's windows
    (:func:`~rebalance.core.backtest.advise.advise`, ``facts["attainable_theta"]``); one
    reason when the run's theta is out of reach. The gain gate still decides: a plan that
    beats staying is applied, one that does not is not (no churn)."""
    try:
        advice = advise(history, float(p.theta), dataclasses.replace(policy, theta_plan=None),
                        target=p.headroom_target, params=params, initial=current,
                        until_one_holds=True)
    except BacktestError:
        return
    facts["attainable_theta"] = advice.attainable
    if advice.reachable:
        return
    best = advice.attainable
    reasons.append(f"theta {p.theta:g} is out of reach on these {history.n_windows} windows: "
                   f"plans keep {advice.at_theta.share_within:.0%} of the following windows "
                   f"within 1 + theta (target {p.headroom_target:.0%}); "
                   + (f"the smallest theta that holds: {best:g}" if best is not None else
                      "no theta up to 2 holds"))


def _choose(before: WindowHistory, current: np.ndarray, p: RunParams, base: PlanParams,
            time_limit: float, reasons: list[str],
            facts: dict[str, Any]) -> tuple[LoadModel | None, float]:
    """Load model and theta_plan from the windows before the held-out ones."""
    theta = float(p.theta)
    model = p.model()
    if model.name == "auto":
        if before.n_windows < 2:
            tp = float(p.theta_plan or theta)
            reasons.append(f"plans on the mean of the {before.n_windows} window(s) before the "
                           f"held-out one(s): too few to choose how to plan by backtest; "
                           f"theta_plan {tp:g}" + (" (set)" if p.theta_plan else " (theta)"))
            facts["choice"] = "too few windows"
            return LoadModel("mean"), tp
        candidates = default_candidates(theta, before.n_windows, before.n_keys, method=p.method,
                                        loads=before.loads)
        if p.theta_plan is not None:  # the run fixes theta_plan: auto chooses the model only
            seen = dict.fromkeys(c.load_model for c in candidates)
            candidates = [Policy.of(m, theta_plan=p.theta_plan, method=p.method) for m in seen]
        choice = choose(before, theta, time_limit=time_limit, target=p.headroom_target,
                        candidates=candidates, params=base, initial=current,
                        min_gain=p.min_backtest_gain)
        facts["choice"] = _table(choice.table)
        reasons.append(f"chosen by backtest: {choice.reason}")
        if choice.stay:
            return None, float(p.theta_plan or theta)
        if not choice.backtested:
            return LoadModel("mean"), float(p.theta_plan or theta)
        return choice.policy.load_model, float(choice.theta_plan)
    if p.theta_plan is not None:
        reasons.append(f"plans on {model.describe()}; theta_plan {p.theta_plan:g} (set)")
        return model, float(p.theta_plan)
    # A model reading every window given is calibrated reading half of them, so that
    # the windows before the held-out ones leave some to judge on.
    policy = _policy(model, None, p.method, max(1, before.n_windows // 2))
    try:
        cal = calibrate(before, policy, theta, target=p.headroom_target, params=base,
                        initial=current)
    except (BacktestError, LoadModelError) as exc:
        reasons.append(f"plans on {model.describe()}; theta_plan {theta:g} (theta: cannot "
                       f"calibrate on {before.n_windows} window(s): {exc})")
        return model, theta
    facts["calibration"] = _table(cal.table)
    reasons.append(f"plans on {model.describe()}; {cal.reason}")
    return model, float(cal.theta_plan)


def _table(frame: pd.DataFrame) -> list[dict[str, Any]]:
    keep = [c for c in ("policy", "theta_plan", "share_within", "mean_imbalance",
                        "mean_stay_imbalance", "migration_per_step", "windows") if c in frame]
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in frame[keep].to_dict("records")]


def forecast_problem(problem: Problem, history: WindowHistory, model: LoadModel) -> Problem:
    """``problem`` (every key of the run, state and current instance as built by
    :func:`rebalance.core.histograms.build_problem`) with the loads of ``model``'s forecast over
    the run's windows, and its scenarios for ``robust``; keys without events get 0."""
    at = pd.Index(history.keys).get_indexer(pd.Index(problem.keys.astype(object)))
    found = at >= 0

    def onto(row: np.ndarray) -> np.ndarray:
        out = np.zeros(problem.n_keys)
        out[found] = row[at[found]]
        return out

    load = onto(forecast(history.loads, model))
    sc = None
    if model.name == "robust":
        sc = np.vstack([onto(r) for r in scenarios(history.loads, model)])
    return dataclasses.replace(problem, load=load, scenarios=sc)
