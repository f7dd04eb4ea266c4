"""The backtest engine, its baselines, calibration, the auto choice and the holdout gate,
on hand-computable histories."""

import math

import numpy as np
import pandas as pd
import pytest

from rebalance.core.backtest import (
    AutoSettings,
    BacktestError,
    Policy,
    WindowHistory,
    backtest,
    calibrate,
    choose,
    holds,
    window_instance_loads,
)
from rebalance.core.forecast import LoadModel, detect_period
from rebalance.core.model import imbalance

KEYS = np.array(["a", "b", "c", "d"], dtype=object)
DEFAULT = np.array([0, 0, 1, 1])     # {a, b} on instance 0, {c, d} on instance 1


def _history(loads, state=None, default=DEFAULT, keys=KEYS, n=2):
    loads = np.asarray(loads, dtype=float)
    return WindowHistory(keys=keys, window_starts=np.arange(len(loads)), loads=loads,
                         state=loads if state is None else np.asarray(state, dtype=float),
                         default=default, n_instances=n)


def _rows(result, policy):
    return result.steps[result.steps["policy"] == policy].reset_index(drop=True)


# window 0 even, windows 1-2 load {a, b} twice as much: default gives 4 / 3
SKEW = [[1, 1, 1, 1], [2, 2, 1, 1], [2, 2, 1, 1]]


def test_none_stay_oracle_distribution_oracle_by_hand():
    h = _history(SKEW)
    past = Policy.of("mean:windows=1")
    r = backtest(h, [past], theta=0.08, oracle_windows=1, oracle_grid=[0.08])
    # judged windows 1 and 2 (the policy needs 1 window)
    none = _rows(r, "none")
    assert none["window"].tolist() == [1, 2]
    assert none["realised_imbalance"].tolist() == pytest.approx([4 / 3, 4 / 3])
    # the past-window plan of window 0 moves nothing and misses window 1; then it plans
    # on window 1 (balanced: 3 / 3) and holds on window 2
    p = _rows(r, past.name)
    assert p["realised_imbalance"].tolist() == pytest.approx([4 / 3, 1.0])
    assert p["within"].tolist() == [False, True]
    assert p["stay_imbalance"].tolist() == pytest.approx([4 / 3, 4 / 3])
    assert p["moved_keys"].tolist() == [0, 2]
    # stay: planned once on window 0 (nothing to do), kept
    assert _rows(r, "stay")["realised_imbalance"].tolist() == pytest.approx([4 / 3, 4 / 3])
    # oracle: plans on the judged window itself
    assert _rows(r, "oracle")["realised_imbalance"].tolist() == pytest.approx([1.0, 1.0])
    # distribution oracle: window 1 is planned on window 2 (the same load), window 2 (the
    # last) on the window before it
    d = _rows(r, "distribution-oracle@0.08")
    assert d["realised_imbalance"].tolist() == pytest.approx([1.0, 1.0])
    s = r.summary.set_index("policy")
    assert s.loc[past.name, "share_within"] == 0.5
    assert s.loc[past.name, "mean_imbalance"] == pytest.approx((4 / 3 + 1) / 2)
    assert s.loc["none", "share_within"] == 0.0
    assert s.loc["oracle", "share_within"] == 1.0
    assert s.loc["distribution-oracle", "share_within"] == 1.0
    assert s.loc["distribution-oracle", "theta_plan"] == 0.08


def test_the_distribution_oracle_does_not_see_the_judged_window_through_its_last_plan():
    # Window 2 is a spike of key a. The plan for window 1 is made on window 2 and puts a
    # alone; window 3's load ([2, 1, 1, 1]) is within 1 + 0.5 under both that plan (2 vs 3)
    # and the default (3 vs 2), so a planner that keeps what is within bound keeps either.
    # A chain would judge window 2 with the plan fitted to window 2 (6 vs 3: 1.33, within);
    # the oracle must start window 2's plan from what it planned without window 2 (the
    # default): 7 vs 2, 1.56, not within.
    loads = [[1, 1, 1, 1], [1, 1, 1, 1], [6, 1, 1, 1], [2, 1, 1, 1], [2, 1, 1, 1]]
    r = backtest(_history(loads), [Policy.of("mean:windows=1")], theta=0.5,
                 oracle_windows=1, oracle_grid=[0.5])
    d = _rows(r, "distribution-oracle@0.5")
    assert d["window"].tolist() == [1, 2, 3, 4]
    assert d["realised_imbalance"].tolist() == pytest.approx([1.5, 7 / 4.5, 1.2, 1.2])
    assert d["within"].tolist() == [True, False, True, True]
    # the per-window oracle does see its window, by definition
    assert _rows(r, "oracle")["realised_imbalance"].iloc[1] == pytest.approx(6 / 4.5)


def test_migration_is_moved_state_over_the_planning_windows_and_chains():
    # state differs from load: moved keys' state over the planning window's total state
    state = [[1, 1, 1, 1], [10, 30, 20, 40], [10, 30, 20, 40]]
    h = _history(SKEW, state=state)
    past = Policy.of("mean:windows=1")
    r = backtest(h, [past], theta=0.08, baselines=())
    p = _rows(r, past.name)
    moved_state = p["migration_fraction"].iloc[1] * 100.0
    # two keys swap (one of {a, b} for one of {c, d}): their state is 30 + 20 or similar
    assert p["moved_keys"].iloc[1] == 2
    assert moved_state in {10 + 20, 10 + 40, 30 + 20, 30 + 40}
    # chained: a third identical window needs no move from the chained assignment
    h3 = _history(SKEW + [[2, 2, 1, 1]], state=state + [[10, 30, 20, 40]])
    r3 = backtest(h3, [past], theta=0.08, baselines=())
    p3 = _rows(r3, past.name)
    assert p3["moved_keys"].tolist() == [0, 2, 0]
    assert p3["migration_fraction"].iloc[2] == 0.0
    assert p3["stay_imbalance"].iloc[2] == pytest.approx(1.0)
    summary = r3.summary.set_index("policy")
    assert summary.loc[past.name, "migration_per_step"] == pytest.approx(
        p3["migration_fraction"].sum() / 3)


def test_initial_assignment_and_horizon():
    h = _history(SKEW)
    balanced = np.array([0, 1, 0, 1])
    r = backtest(h, [Policy.of("mean:windows=1")], theta=0.08, horizon=2,
                 baselines=("none", "stay"), initial=balanced)
    p = _rows(r, "mean:windows=1/W=1")
    assert p["window"].tolist() == [1, 2]          # one step, two judged windows
    assert p["step"].tolist() == [1, 1]
    assert p["realised_imbalance"].tolist() == pytest.approx([1.0, 1.0])
    assert r.summary.set_index("policy").loc["mean:windows=1/W=1", "steps"] == 1


def test_robust_policy_keeps_alternating_windows():
    # windows alternate between two pairs: the mean of two windows is even, each window
    # is not; the robust plan over the last 2 windows splits both pairs
    alt = [[2, 0, 2, 0], [0, 2, 0, 2]] * 3
    default = np.array([0, 1, 0, 1])
    h = _history(alt, default=default)
    mean2 = Policy.of("mean:windows=2")
    robust2 = Policy.of("robust:windows=2")
    r = backtest(h, [mean2, robust2], theta=0.08, baselines=())
    s = r.summary.set_index("policy")
    assert s.loc[mean2.name, "share_within"] == 0.0
    assert s.loc[robust2.name, "share_within"] == 1.0


def test_window_instance_loads_and_deterministic():
    loads = np.array([[2.0, 2.0, 1.0, 1.0], [0, 0, 0, 0]])
    per_instance = window_instance_loads(loads, DEFAULT, 2)
    assert per_instance.tolist() == [[4.0, 2.0], [0.0, 0.0]]
    assert imbalance(per_instance).tolist() == pytest.approx([4 / 3, 1.0])
    rng = np.random.default_rng(0)
    h = _history(rng.poisson(5, (12, 4)) + 1)
    pols = [Policy.of("mean:windows=1"), Policy.of("ewm:halflife=2,windows=3", theta_plan=0.02)]
    a = backtest(h, pols, theta=0.1)
    b = backtest(h, pols, theta=0.1)
    cols = ["policy", "window", "realised_imbalance", "migration_fraction"]
    pd.testing.assert_frame_equal(a.steps[cols], b.steps[cols])


def test_from_counts_and_from_histograms_agree():
    frame = pd.DataFrame({"window": [0, 0, 1, 1, 1], "key": ["x", "y", "x", "y", "z"],
                          "count": [3, 1, 2, 2, 5]})
    h = WindowHistory.from_counts(frame, n_instances=4)
    assert h.keys.tolist() == ["x", "y", "z"]
    assert h.loads.tolist() == [[3, 1, 0], [2, 2, 5]]
    assert ((h.default >= 0) & (h.default < 4)).all()
    hist = pd.DataFrame({"window_start": pd.to_datetime(["2024-01-01", "2024-01-01",
                                                         "2024-01-02"]),
                         "key": ["x", "y", "x"], "count": [3, 1, 2],
                         "state_bytes": [30, 10, 20]})
    h2 = WindowHistory.from_histograms(hist, n_instances=4)
    assert h2.loads.tolist() == [[3, 1], [2, 0]]
    assert h2.state.tolist() == [[30, 10], [20, 0]]
    with pytest.raises(BacktestError, match="lacks column"):
        WindowHistory.from_counts(frame.rename(columns={"count": "n"}), n_instances=2)


def test_refusals_are_one_line():
    h = _history(SKEW)
    with pytest.raises(BacktestError, match="too few"):
        backtest(h, [Policy.of("mean:windows=3")], theta=0.08)
    with pytest.raises(BacktestError, match="theta must be"):
        backtest(h, [], theta=0)
    with pytest.raises(BacktestError, match="unknown method"):
        Policy(method="nope")
    with pytest.raises(BacktestError, match="shorter than load model"):
        Policy(load_model=LoadModel.parse("mean:windows=3"), history=2)
    with pytest.raises(BacktestError, match="loads must be finite"):
        _history([[1, 1, -1, 1]])


# ------------------------------------------------------------------ calibration
def _noisy(seed=7, windows=40, keys=40, n=4, noise=0.05):
    rng = np.random.default_rng(seed)
    base = rng.uniform(1, 3, keys)
    loads = base[None, :] * (1 + noise * rng.uniform(-1, 1, (windows, keys)))
    names = np.array([f"k{i:02d}" for i in range(keys)], dtype=object)
    default = np.zeros(keys, dtype=np.int64)       # all on one instance: plans must move
    return _history(loads, keys=names, default=default, n=n)


def test_calibration_needs_headroom_on_noisy_windows():
    h = _noisy()
    policy = Policy.of("mean:windows=1")
    cal = calibrate(h, policy, theta=0.04, target=0.9)
    table = cal.table.set_index("theta_plan")
    assert table.loc[0.04, "share_within"] < 0.9          # planning at theta does not hold
    assert cal.theta_plan < 0.04 and cal.share_within >= 0.9
    assert "at the least migration" in cal.reason


def test_calibration_keeps_theta_when_loads_do_not_change():
    loads = np.tile(np.array([3.0, 2.0, 2.0, 1.0, 1.0, 1.0]), (6, 1))
    keys = np.array(list("abcdef"), dtype=object)
    h = _history(loads, keys=keys, default=np.zeros(6, dtype=np.int64), n=2)
    cal = calibrate(h, Policy.of("mean:windows=1"), theta=0.1, target=0.9)
    assert cal.theta_plan == pytest.approx(0.1)
    assert cal.share_within == 1.0


def test_calibration_reports_the_best_share_when_no_point_reaches_the_target():
    alt = [[4, 0, 0, 0], [0, 0, 0, 4]] * 3       # one key carries all the load
    cal = calibrate(_history(alt), Policy.of("mean:windows=1"), theta=0.1, target=0.9)
    assert cal.share_within == 0.0
    assert cal.reason.startswith("no theta_plan reaches the target 90%")


# ------------------------------------------------------------------ auto and the gate
#: b holds the least state, so every plan moves b (the cheapest key) and nothing else
FLIP_STATE = [[100, 1, 100, 100]]


def test_choose_stays_when_plans_do_not_hold():
    # the load flips between pairs every window: plans made on the past miss the next one,
    # while the default ({a, b}, {c, d}) is balanced in every other window
    flip = [[1, 1, 0, 0], [0, 1, 1, 0]] * 4
    h = _history(flip, state=FLIP_STATE * 8, default=np.array([0, 0, 1, 1]))
    c = choose(h, theta=0.08, candidates=[Policy.of("mean:windows=1"),
                                          Policy.of("mean:windows=1", theta_plan=0.02)])
    assert c.stay and c.policy is None
    assert c.reason.startswith("plans made on these windows do not hold: backtested realised")
    assert len(c.table) == 2


def test_choose_picks_a_plan_that_holds_at_the_least_migration():
    h = _noisy(noise=0.0)
    cands = [Policy.of("mean:windows=1"), Policy.of("mean:windows=3"),
             Policy.of("mean:windows=1", theta_plan=0.01)]
    c = choose(h, theta=0.04, candidates=cands)
    assert not c.stay
    assert c.policy.name in {cands[0].name, cands[1].name}
    assert c.theta_plan == pytest.approx(0.04)
    assert "staying" in c.reason and c.stay_imbalance > 1.5


def test_choose_with_one_window_cannot_backtest():
    c = choose(_history([[1, 2, 3, 4]]), theta=0.08)
    assert c.policy is None and not c.backtested and not c.stay
    assert "too few to backtest" in c.reason
    # two windows, each candidate planning on both: nothing left to judge either
    two = choose(_history([[1, 2, 3, 4], [1, 2, 3, 4]]), theta=0.08,
                 candidates=[Policy.of("mean:windows=2")])
    assert not two.backtested and not two.stay and "every candidate plans on 2" in two.reason


def test_holds_gate():
    # a plan made on [1, 1, 0] moves b beside c; the held-out window [0, 1, 1] then loads
    # b and c on one instance (2.0) where staying is balanced (1.0)
    keys = np.array(["a", "b", "c"], dtype=object)
    default = np.array([0, 0, 1])
    h = _history([[1, 1, 0], [0, 1, 1]], state=[[10, 1, 1]] * 2, keys=keys, default=default)
    out = holds(h, Policy.of("mean:windows=1"), theta=0.08, holdout=1)
    assert not out.holds
    assert out.plan_imbalance == pytest.approx(2.0) and out.stay_imbalance == pytest.approx(1.0)
    assert out.reason == ("plans made on these windows do not hold: backtested realised 2.00 "
                          "vs 1.00 staying over 1 held-out window(s)")
    # a steady skew: the plan holds
    good = holds(_history(SKEW), Policy.of("mean:windows=1"), theta=0.08, holdout=1)
    assert good.holds and good.plan_imbalance == pytest.approx(1.0)
    assert good.stay_imbalance == pytest.approx(4 / 3)
    with pytest.raises(BacktestError, match="too few"):
        holds(h, Policy.of("mean:windows=2"), theta=0.08, holdout=1)


def test_auto_policy_in_the_backtest_never_loses_to_staying_when_plans_do_not_hold():
    flip = [[1, 1, 0, 0], [0, 1, 1, 0]] * 8
    h = _history(flip, state=FLIP_STATE * 16, default=np.array([0, 0, 1, 1]))
    auto = Policy(name="auto", load_model=LoadModel("auto"))
    r = backtest(h, [auto, Policy.of("mean:windows=1")], theta=0.08,
                 baselines=("stay",), auto_settings=AutoSettings(
                     candidates=[Policy.of("mean:windows=1"),
                                 Policy.of("mean:windows=1", theta_plan=0.02)]))
    s = r.summary.set_index("policy")
    assert s.loc["auto", "mean_imbalance"] <= s.loc["stay", "mean_imbalance"] + 1e-9
    assert s.loc["mean:windows=1/W=1", "mean_imbalance"] > s.loc["stay", "mean_imbalance"]
    reasons = [why for _, why in r.choices["auto"]]
    assert any("do not hold" in w or "does not pay" in w for w in reasons)
    assert not math.isnan(s.loc["auto", "share_within"])


def test_given_forecasts_plan_on_what_they_are_given_and_are_judged_on_the_stored_windows():
    from rebalance.core.backtest import given_forecasts

    h = _history(SKEW)
    # given the judged window's own loads, every plan holds (the per-window oracle)
    own = given_forecasts(h, h.loads, 0.08, [1, 2], "own", grid=[0.08, 0.02])
    assert [s["share_within"] for s in own] == [1.0, 1.0]
    assert own[0]["mean_imbalance"] == pytest.approx(1.0)
    # given the window before (window 0 is even: nothing to plan), window 1 is missed
    before = np.vstack([h.loads[:1], h.loads[:-1]])
    late = given_forecasts(h, before, 0.08, [1, 2], "late", grid=[0.08])
    assert late[0]["share_within"] == 0.5
    assert late[0]["mean_imbalance"] == pytest.approx((4 / 3 + 1.0) / 2)
    with pytest.raises(BacktestError, match=r"forecasts must have shape \(3, 4\)"):
        given_forecasts(h, h.loads[:2], 0.08, [1], "short")


def test_auto_seasonal_candidates_read_a_detected_period_over_one_two_and_four_periods():
    """Every period auto tries gets a seasonal candidate one period back where the windows
    hold two periods; the period detected in the windows also gets the same slot averaged
    over, and robust over, 2 and 4 periods, each where the windows hold twice as many (and
    leave half to judge on)."""
    from rebalance.core.backtest.auto import AUTO_SEASONS, default_candidates

    assert AUTO_SEASONS == (1, 2, 4)

    def seasonal(n_windows, loads=None):
        return sorted({(p.load_model.name[0], p.load_model.period, p.load_model.windows)
                       for p in default_candidates(0.08, n_windows, loads=loads)
                       if p.load_model.period is not None})

    assert seasonal(15) == []
    assert seasonal(16) == [("s", 7, 7)]
    assert seasonal(50) == [("s", 7, 7), ("s", 24, 24)]
    assert seasonal(200) == [("s", 7, 7), ("s", 24, 24)]    # no period shown: one back
    rng = np.random.default_rng(5)
    week = rng.uniform(1, 50, size=(7, 12))
    loads = np.tile(week, (8, 1)) + rng.uniform(0, 0.5, size=(56, 12))
    assert detect_period(loads) == 7
    assert seasonal(29, loads) == [("s", 7, 7)]
    assert seasonal(30, loads) == [("r", 7, 14), ("s", 7, 7), ("s", 7, 14)]
    assert seasonal(58, loads) == [("r", 7, 14), ("r", 7, 28), ("s", 7, 7), ("s", 7, 14),
                                   ("s", 7, 28), ("s", 24, 24)]
    assert seasonal(200, loads) == seasonal(58, loads)
    # every seasonal candidate at each fraction of theta
    cands = [p for p in default_candidates(0.08, 30, loads=loads)
             if p.load_model.period is not None]
    assert sorted((str(p.load_model), p.theta_plan or 0.08) for p in cands) == [
        ("robust:windows=14,period=7", 0.04), ("robust:windows=14,period=7", 0.08),
        ("seasonal:windows=14,period=7", 0.04), ("seasonal:windows=14,period=7", 0.08),
        ("seasonal:windows=7,period=7", 0.04), ("seasonal:windows=7,period=7", 0.08)]


def test_auto_candidates_at_every_headroom_and_the_share_slack_of_the_choice():
    """The settings the backtest benchmark's --sensitivity varies: every load model at
    each fraction of theta given; and a candidate a few points of share below the best is
    chosen for migrating less only within the slack."""
    from rebalance.core.backtest.auto import AUTO_HEADROOM, _pick, default_candidates

    two = default_candidates(0.08, 100)
    three = default_candidates(0.08, 100, headroom=(1.0, 0.75, 0.5))
    assert len(two) == len(AUTO_HEADROOM) * len(three) // 3
    assert sorted({p.theta_plan for p in three}, key=lambda t: t or 1) == [
        pytest.approx(0.04), pytest.approx(0.06), None]
    table = pd.DataFrame({"policy": ["cheap", "best"], "share_within": [0.70, 0.73],
                          "mean_imbalance": [1.07, 1.07], "migration_per_step": [0.01, 0.03],
                          "windows": 50})
    assert _pick(table, math.inf, 0.08, 0.9)[0] == 0                    # default slack 0.05
    assert _pick(table, math.inf, 0.08, 0.9, share_slack=0.0)[0] == 1
    # near the best share, a cheaper candidate may be a little worse on the mean: by
    # theta / 8 by default (0.01 here), not by more than the tolerance given
    table["mean_imbalance"] = [1.076, 1.07]
    assert _pick(table, math.inf, 0.08, 0.9)[0] == 0
    assert _pick(table, math.inf, 0.08, 0.9, mean_tolerance=1 / 32)[0] == 1


def test_auto_reuses_candidate_chains_across_selection_settings_of_the_same_history(monkeypatch):
    """A ``candidate_runs`` dict kept across backtests of one history (the benchmark's --sensitivity)
    runs each candidate once; the figures are those of backtests without it; another
    history given the same dict gets chains of its own."""
    from rebalance.core.backtest import engine

    rng = np.random.default_rng(7)
    keys = np.array([f"k{i}" for i in range(8)], dtype=object)
    make = lambda: _history(rng.poisson(20, size=(40, 8)) * np.linspace(1, 3, 8),  # noqa: E731
                            default=np.arange(8) % 2, keys=keys)
    h, other = make(), make()
    auto = Policy(name="auto", load_model=LoadModel("auto"))
    settings = [AutoSettings(), AutoSettings(share_slack=0.0),
                AutoSettings(headroom=(1.0, 0.75, 0.5))]
    plain = [backtest(h, [auto], 0.08, start=20, baselines=(), auto_settings=o).steps
             for o in settings]
    calls = []
    real = engine._run_policy
    monkeypatch.setattr(engine, "_run_policy", lambda *a: calls.append(a[1]) or real(*a))
    runs: dict = {}
    for o, want in zip(settings, plain):
        got = backtest(h, [auto], 0.08, start=20, baselines=(), auto_settings=o,
                       candidate_runs=runs)
        pd.testing.assert_frame_equal(got.steps.drop(columns="plan_seconds"),
                                      want.drop(columns="plan_seconds"))
    # the third setting's 0.75 candidates are new; every other candidate ran once
    assert len(calls) == len(set(calls)) == len(runs)
    assert sorted({round(p.theta_plan or 0.08, 9) for p in calls}) == [0.04, 0.06, 0.08]
    calls.clear()
    alone = backtest(other, [auto], 0.08, start=20, baselines=()).steps
    n_alone = len(calls)
    calls.clear()
    got = backtest(other, [auto], 0.08, start=20, baselines=(), candidate_runs=runs)
    assert n_alone > 0 and len(calls) == n_alone          # not the chains of `h`
    pd.testing.assert_frame_equal(got.steps.drop(columns="plan_seconds"),
                                  alone.drop(columns="plan_seconds"))
