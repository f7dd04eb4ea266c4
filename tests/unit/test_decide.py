"""What a DAG run decides from its windows (rebalance.control.decide), without Spark: the
theta trigger on the live assignment, the load model and theta_plan chosen by backtest
on the windows before the held-out ones, and the gain gate on the held-out windows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rebalance.control import decide
from rebalance.control.params import RunParams
from rebalance.core.backtest import WindowHistory
from rebalance.core.histograms import build_problem
from rebalance.core.placement import default_instances

N = 4
KEYS = [f"user-{i:04d}" for i in range(200)]
DEFAULT = default_instances(KEYS, N)
COLD = 10


def rows(windows: list[dict[str, int]]) -> pd.DataFrame:
    """Histogram rows (the key_histograms columns the DAG reads), one window a minute."""
    t0 = pd.Timestamp("2026-03-02 11:50")
    return pd.DataFrame(
        [(t0 + pd.Timedelta(minutes=i), k, c[k], float(c[k]), 232)
         for i, c in enumerate(windows) for k in KEYS],
        columns=["window_start", "key", "count", "cost", "state_bytes"])


def keys_on(instance: int) -> list[str]:
    return [k for k, d in zip(KEYS, DEFAULT) if d == instance]


def stable_skew(n_windows: int = 6, extra: int = 300) -> list[dict[str, int]]:
    """Four keys of instance 0 carry ``extra`` more events every window."""
    counts = dict.fromkeys(KEYS, COLD)
    for k in keys_on(0)[:4]:
        counts[k] += extra
    return [counts] * n_windows


def moving_bursts(n_windows: int = 6, burst: int = 800) -> list[dict[str, int]]:
    """Each window a key never hot before takes a burst, on instance 0, 1, 2, 3, 0, ... in
    turn: the past windows do not say where the next burst lands, and a plan that moved
    load off the last burst's instance loaded the one where the next lands."""
    out = []
    for w in range(n_windows):
        counts = dict.fromkeys(KEYS, COLD)
        counts[keys_on(w % N)[w // N]] += burst
        out.append(counts)
    return out


def history(windows) -> tuple[WindowHistory, np.ndarray]:
    h = WindowHistory.from_histograms(rows(windows), N)
    return h, h.default.copy()  # live assignment: every key on its default instance


def params(**kw) -> RunParams:
    return RunParams.parse({"method": "mixed", **kw})


# ---------------------------------------------------------------------- detect
def test_detect_theta_fires_on_a_skew_and_names_every_window():
    h, live = history(stable_skew())
    decision, facts = decide.detect(h, live, params(), events=99_999, periods_since_last=None)
    assert decision.trigger and facts["rule"] == "theta"
    assert len(facts["window_imbalance"]) == 6 and min(facts["window_imbalance"]) > 1.1
    assert facts["bound"] == pytest.approx(1.1)
    assert "3 of the latest 3 window(s) exceed 1 + theta = 1.100" in facts["decision"]


def test_detect_theta_judges_the_live_assignment_and_follows_theta():
    h, live = history(stable_skew())
    # the same windows under an assignment that already moved the hot keys apart
    hot = [i for i, k in enumerate(h.keys) if k in keys_on(0)[:4]]
    spread = live.copy()
    spread[hot] = [0, 1, 2, 3]
    decision, facts = decide.detect(h, spread, params(), 99_999, None)
    assert not decision.trigger and max(facts["window_imbalance"]) < 1.1
    # a bound loose enough for the skew: no plan
    decision, _ = decide.detect(h, live, params(theta=2.0), 99_999, None)
    assert not decision.trigger and "exceed 1 + theta = 3.000" in decision.reasons[0]


def test_detect_mldc_keeps_its_own_rules():
    h, live = history(stable_skew())
    p = params(trigger_rule="mldc")
    decision, facts = decide.detect(h, live, p, events=99_999, periods_since_last=1)
    assert facts["rule"] == "mldc" and facts["imbalance"] > 1.5
    assert decision.reasons == ["last rebalance 1 period(s) ago, cooldown is 3 period(s)"]
    assert decide.rule_text(p.trigger_rule).startswith("MLDC trigger rules")
    decision, _ = decide.detect(h, live, p, events=99_999, periods_since_last=None)
    assert decision.trigger


# ---------------------------------------------------------------------- plan
def test_a_stable_skew_is_planned_and_its_backtest_holds():
    h, live = history(stable_skew())
    planning = decide.plan_policy(h, live, params(), time_limit=10.0)
    assert not planning.skip and not planning.decision.forced
    f = planning.facts
    assert f["holdout"] == 2 and len(f["held_out"]) == 2 and f["windows"] == 6
    assert f["planned"] <= 1.1 < 1.5 < f["staying"]
    assert f["gain"] == pytest.approx(f["staying"] - f["planned"])
    assert 0 < planning.theta_plan <= 0.1 and planning.load_model is not None
    assert planning.reasons[0].startswith("chosen by backtest: plans on ")
    assert planning.reasons[-1].startswith("rebalance: plans made on these windows hold: "
                                           "backtested realised ")
    assert len(f["window_rows"]) == 2 and all(r["planned"] < r["staying"]
                                             for r in f["window_rows"])


@pytest.mark.parametrize("load_model", ["auto", "mean", "max:windows=3", "robust:windows=3"])
def test_moving_bursts_are_not_planned_because_the_plans_do_not_hold(load_model):
    h, live = history(moving_bursts())
    assert decide.detect(h, live, params(), 99_999, None)[0].trigger  # every window is over
    planning = decide.plan_policy(h, live, params(load_model=load_model), time_limit=10.0)
    assert planning.skip
    (reason,) = planning.decision.reasons
    assert "plans made on these windows do not hold: backtested realised " in reason
    assert "staying" in reason
    # in words, without the policy's label or the load model's spelling
    assert "W=" not in reason and "windows=" not in reason, reason


def test_the_gain_gate_uses_min_backtest_gain():
    h, live = history(stable_skew(extra=60))
    held = decide.plan_policy(h, live, params(load_model="mean"), 10.0)
    gain = held.facts["gain"]
    assert not held.skip and 0.1 < gain < 0.5
    # the same plan, asked to gain more than it does, is skipped with both figures
    strict = decide.plan_policy(h, live, params(load_model="mean", min_backtest_gain=0.5), 10.0)
    assert strict.skip and strict.facts["gain"] == pytest.approx(gain)
    assert (f"backtested realised {strict.facts['planned']:.3f} vs "
            f"{strict.facts['staying']:.3f} staying") in strict.decision.reasons[0]
    assert f"(gain {gain:+.3f}, at least 0.500 required)" in strict.decision.reasons[0]


def test_force_plans_what_the_backtest_refuses_and_says_so():
    h, live = history(moving_bursts())
    planning = decide.plan_policy(h, live, params(force=True), 10.0)
    assert not planning.skip and planning.decision.forced and planning.load_model is not None
    assert any("do not hold" in r for r in planning.reasons)
    assert str(planning.decision).startswith("rebalance (forced)") or any(
        r.startswith("forced: ") for r in planning.reasons)


def test_a_named_load_model_and_theta_plan_are_used_as_given():
    h, live = history(stable_skew())
    planning = decide.plan_policy(h, live, params(load_model="ewm:halflife=2", theta_plan=0.04),
                                  10.0)
    assert str(planning.load_model) == "ewm" and planning.theta_plan == 0.04
    assert planning.reasons[0] == ("plans on a mean of every window weighted toward the "
                                   "latest (half-life 2 windows); theta_plan 0.04 (set)")
    # without theta_plan, a named model's theta_plan is calibrated on the windows before
    calibrated = decide.plan_policy(h, live, params(load_model="mean"), 10.0)
    assert 0 < calibrated.theta_plan <= 0.1 and "calibration" in calibrated.facts
    assert calibrated.reasons[0].startswith("plans on the mean of every window; theta_plan ")


def test_one_window_cannot_be_backtested():
    h, live = history(stable_skew(1))
    planning = decide.plan_policy(h, live, params(min_windows=1), 10.0)
    assert planning.skip and planning.decision.reasons == [
        "not enough windows yet: 1 of 2 needed to judge a plan on a window it was not made "
        "on (min_windows >= 2 lets every run backtest)"]
    forced = decide.plan_policy(h, live, params(min_windows=1, force=True), 10.0)
    assert not forced.skip and forced.reasons[0].startswith("not backtested (forced): ")


def test_two_windows_plan_on_one_and_judge_on_the_other():
    h, live = history(stable_skew(2))
    planning = decide.plan_policy(h, live, params(), 10.0)
    assert not planning.skip and planning.facts["holdout"] == 1
    assert "too few to choose how to plan by backtest" in planning.reasons[0]


def test_the_forecast_problem_covers_every_key_of_the_run():
    windows = stable_skew(3)
    h, _ = history(windows)
    frame = rows(windows)
    routing = pd.DataFrame({"key": ["only-routed"], "instance": [2]})  # a key without events
    problem, _ = build_problem(frame, N, routing, windows=3)
    from rebalance.core.forecast import LoadModel

    mean = decide.forecast_problem(problem, h, LoadModel("mean"))
    assert mean.n_keys == len(KEYS) + 1 and mean.scenarios is None
    assert np.allclose(mean.load, problem.load)  # the mean of the windows is today's load
    assert mean.load[list(mean.keys).index("only-routed")] == 0
    robust = decide.forecast_problem(problem, h, LoadModel("robust", windows=2))
    assert robust.scenarios.shape == (2, len(KEYS) + 1)
    assert np.allclose(robust.scenarios[:, list(robust.keys).index(keys_on(0)[0])], 310)
    assert (robust.state == problem.state).all() and (robust.current == problem.current).all()


def test_a_plan_s_first_reason_says_what_it_does_in_plain_words():
    metrics = {"moved_keys": 12, "migration_fraction": 0.031, "table_size": 40,
               "imbalance_before": 1.8, "imbalance_after": 1.05, "feasible": True}
    assert decide.plan_summary(metrics, 0.05) == (
        "moves 12 key(s) (3.1% of the state); routing table 40 entries; imbalance "
        "1.800 -> 1.050 predicted")
    split = {**metrics, "split_keys": 3, "feasible": False}
    text = decide.plan_summary(split, 0.05)
    assert "; 3 hot key(s) split over several instances;" in text
    assert text.endswith("above the bound it was planned for (1 + 0.05) or outside a limit: "
                         "the best the planner found")
    assert decide.plan_summary({**metrics, "moved_keys": 0}, 0.05).startswith("moves no key;")


@pytest.mark.parametrize("model, words", [
    ("mean:windows=1", "the mean of the last window"),
    ("mean:windows=3", "the mean of the last 3 windows"),
    ("quantile:q=0.9,windows=7", "each key's 90% quantile over the last 7 windows"),
    ("max:windows=7", "each key's peak over the last 7 windows"),
    ("robust:windows=3", "each of the last 3 windows within the bound"),
    ("seasonal:period=24,windows=48",
     "the mean of the same window in each earlier period of 24 windows (within the last 48 "
     "windows)"),
])
def test_load_models_and_policies_are_described_in_words(model, words):
    from rebalance.core.backtest import Policy
    from rebalance.core.forecast import LoadModel

    assert LoadModel.parse(model).describe() == words
    assert Policy.of(model).describe() == f"plans on {words}"
    assert Policy.of(model, theta_plan=0.02, method="greedy").describe() == (
        f"plans on {words}, at theta_plan 0.02, planner greedy")


def test_a_theta_out_of_reach_is_said_once_with_the_theta_that_holds():
    windows = stable_skew()
    hot = dict(windows[0])
    # 200 keys of 10, 4 of them + 300, one of those + 3000 more: 6 200 events over N = 4,
    # mean 1 550; the hot key alone carries 3 310 = 2.135 mean loads, so theta must be
    # >= 1.135: 1.25 of the grid
    hot[keys_on(0)[0]] += 3000
    h, live = history([hot] * 6)
    planning = decide.plan_policy(h, live, params(), time_limit=10.0)
    said = [r for r in planning.reasons if "out of reach" in r]
    assert said == ["theta 0.1 is out of reach on these 6 windows: plans keep 0% of the "
                    "following windows within 1 + theta (target 90%); the smallest theta "
                    "that holds: 1.25"], planning.reasons
    assert planning.facts["attainable_theta"] == 1.25
    assert not planning.skip          # the plan still beats staying: it is applied


def test_a_theta_in_reach_says_nothing_more():
    h, live = history(stable_skew())
    planning = decide.plan_policy(h, live, params(), time_limit=10.0)
    assert not any("out of reach" in r for r in planning.reasons)
    assert planning.facts["attainable_theta"] <= 0.1
