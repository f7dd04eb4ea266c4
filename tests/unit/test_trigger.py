"""The trigger rules (theta, and mldc: the MLDC paper's) and the backtested-gain gate."""

from __future__ import annotations

import math

import pytest

from rebalance.core.trigger import Decision, GainGate, ThetaTrigger, TriggerPolicy, mldc

POLICY = TriggerPolicy()


def decide(**overrides) -> Decision:
    args = {"imbalance": 1.8, "items": 5000, "periods_since_last": 10,
            "predicted_imbalance": 1.2, **overrides}
    return POLICY.decide(**args)


def test_paper_defaults():
    assert (POLICY.threshold, POLICY.min_items, POLICY.cooldown, POLICY.min_improvement) == \
        (0.5, 1000, 3, 0.3)


def test_worked_example_triggers():
    # MLDC 0.8 -> 0.2: above the threshold, improvement 0.6 > 0.3.
    decision = decide()
    assert decision.trigger and decision.reasons == [] and not decision.forced
    assert str(decision) == "rebalance: every trigger condition holds"


def test_threshold_blocks():
    decision = decide(imbalance=1.5, predicted_imbalance=1.0)
    assert not decision.trigger
    assert decision.reasons == ["MLDC 0.500 is not above the threshold 0.500"]


def test_too_few_items_block():
    decision = decide(items=999)
    assert decision.reasons == ["only 999 items processed in the horizon, need at least 1000"]
    assert decide(items=1000).trigger


@pytest.mark.parametrize(("periods", "blocked"), [(0, True), (2, True), (3, False), (None, False)])
def test_cooldown(periods, blocked):
    decision = decide(periods_since_last=periods)
    assert decision.trigger is not blocked
    if blocked:
        assert decision.reasons == [
            f"last rebalance {periods} period(s) ago, cooldown is 3 period(s)"]


def test_small_improvement_blocks():
    decision = decide(predicted_imbalance=1.55)
    assert not decision.trigger
    assert decision.reasons == [
        "the candidate plan improves MLDC by 0.250 (0.800 -> 0.550), not more than 0.300"]


def test_missing_prediction_blocks():
    decision = decide(predicted_imbalance=None)
    assert decision.reasons == ["no candidate plan: the MLDC improvement cannot be predicted"]


def test_every_blocking_rule_is_reported():
    decision = decide(imbalance=1.1, items=10, periods_since_last=1, predicted_imbalance=1.05)
    assert not decision.trigger
    assert len(decision.reasons) == 4
    assert str(decision).startswith("no rebalance: MLDC 0.100")


def test_force_overrides_and_records_what_it_overrode():
    decision = decide(items=10, force=True)
    assert decision.trigger and decision.forced
    assert decision.reasons == ["only 10 items processed in the horizon, need at least 1000"]
    assert str(decision).startswith("rebalance (forced): overrides only 10 items")


def test_nan_imbalance_never_triggers():
    assert not decide(imbalance=math.nan).trigger


def test_mldc():
    assert mldc(1.8) == pytest.approx(0.8)


@pytest.mark.parametrize("kwargs", [{"threshold": -1}, {"min_improvement": math.inf},
                                    {"min_items": -5}, {"cooldown": 1.5}, {"cooldown": True}])
def test_bad_parameters_are_rejected(kwargs):
    with pytest.raises(ValueError):
        TriggerPolicy(**kwargs)


# ------------------------------------------------------------------ the theta trigger


@pytest.mark.parametrize(("imbalances", "fires"), [
    ([1.05, 1.20, 1.30], True),          # 2 of the latest 3 over 1.1
    ([1.30, 1.20, 1.05], True),          # the same two, latest within: still persistent
    ([1.05, 1.05, 1.30], False),         # one burst in the latest window only
    ([1.30, 1.05, 1.05], False),
    ([1.50, 1.50, 1.05, 1.05, 1.30], False),  # older windows do not count
    ([1.20, 1.20], True),                # 2 of 2
    ([1.20, 1.05], False),               # 1 of 2 is no majority
    ([1.20], True),                      # 1 of 1
    ([1.10, 1.10, 1.10], False),         # exactly at the bound is within it
])
def test_theta_trigger_fires_on_a_majority_of_the_latest_three_windows(imbalances, fires):
    decision = ThetaTrigger(theta=0.1).decide(imbalances)
    assert decision.trigger is fires and not decision.forced
    if fires:
        assert str(decision).startswith("rebalance: ")
        assert "exceed 1 + theta = 1.100" in str(decision)
    else:
        (reason,) = decision.reasons
        assert reason.startswith("only ") and "the trigger needs" in reason


def test_theta_trigger_reason_names_the_windows_and_the_bound():
    decision = ThetaTrigger(theta=0.2).decide([1.9, 1.25, 1.1, 1.15])
    assert decision.reasons == [
        "only 1 of the latest 3 window(s) exceed 1 + theta = 1.200 "
        "(imbalance 1.250, 1.100, 1.150); the trigger needs 2"]


def test_theta_trigger_follows_theta():
    windows = [1.15, 1.15, 1.15]
    assert ThetaTrigger(theta=0.1).decide(windows).trigger
    assert not ThetaTrigger(theta=0.2).decide(windows).trigger


def test_theta_trigger_nan_and_no_window_never_fire_but_force_does():
    assert not ThetaTrigger(theta=0.1).decide([math.nan, math.nan, 1.5]).trigger
    empty = ThetaTrigger(theta=0.1).decide([])
    assert not empty.trigger and empty.reasons == ["no window to judge the imbalance on"]
    forced = ThetaTrigger(theta=0.1).decide([1.0, 1.0, 1.0], force=True)
    assert forced.trigger and forced.forced
    assert str(forced).startswith("rebalance (forced): overrides only 0 of the latest 3")


@pytest.mark.parametrize("kwargs", [{"theta": 0}, {"theta": math.nan}, {"theta": True},
                                    {"theta": 0.1, "recent": 0}, {"theta": 0.1, "recent": 2.5}])
def test_theta_trigger_bad_parameters_are_rejected(kwargs):
    with pytest.raises(ValueError):
        ThetaTrigger(**kwargs)


# ------------------------------------------------------------------ the gain gate
def test_gain_gate_skips_a_plan_that_does_not_beat_staying():
    decision = GainGate(min_gain=0.01).decide(planned=1.49, staying=1.46, windows=2)
    assert not decision.trigger
    assert decision.reasons == [
        "plans made on these windows do not hold: backtested realised 1.490 vs 1.460 "
        "staying on the 2 held-out window(s) (gain -0.030, at least 0.010 required)"]


def test_gain_gate_needs_the_minimum_gain_not_just_any_gain():
    gate = GainGate(min_gain=0.05)
    assert not gate.decide(planned=1.42, staying=1.46, windows=1).trigger   # gain 0.04
    assert gate.decide(planned=1.40, staying=1.46, windows=1).trigger       # gain 0.06
    assert gate.decide(planned=1.41, staying=1.46, windows=1).trigger       # gain 0.05
    held = gate.decide(planned=1.10, staying=1.46, windows=3)
    assert str(held) == ("rebalance: plans made on these windows hold: backtested realised "
                         "1.100 vs 1.460 staying on the 3 held-out window(s) (gain +0.360)")


def test_gain_gate_a_tie_is_no_gain_and_nan_blocks():
    assert not GainGate(min_gain=0.01).decide(1.3, 1.3, 2).trigger
    assert GainGate(min_gain=0.0).decide(1.3, 1.3, 2).trigger
    assert not GainGate().decide(math.nan, 1.3, 2).trigger
    assert not GainGate().decide(1.1, math.nan, 2).trigger


def test_gain_gate_force_applies_and_records_what_it_overrode():
    decision = GainGate(min_gain=0.01).decide(planned=1.49, staying=1.46, windows=2, force=True)
    assert decision.trigger and decision.forced
    assert str(decision).startswith("rebalance (forced): overrides plans made on these "
                                    "windows do not hold: backtested realised 1.490")


@pytest.mark.parametrize("min_gain", [-0.01, math.nan, math.inf, True])
def test_gain_gate_bad_minimum_is_rejected(min_gain):
    with pytest.raises(ValueError):
        GainGate(min_gain=min_gain)
