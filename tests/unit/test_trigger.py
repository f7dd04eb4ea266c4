"""Seed 004's trigger rules."""

from __future__ import annotations

import math

import pytest

from rebalance.trigger import Decision, TriggerPolicy, mldc

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
