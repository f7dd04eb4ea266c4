"""Load models of rebalance.core.forecast: exact values on small arrays, parsing, refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rebalance.core.forecast import LOAD_MODELS, LoadModel, LoadModelError, forecast, scenarios

# 3 windows x 3 keys, oldest first
S = np.array([[1.0, 2.0, 3.0],
              [3.0, 2.0, 1.0],
              [5.0, 2.0, 0.0]])


def test_mean_all_and_last_windows():
    assert forecast(S, LoadModel("mean")).tolist() == [3.0, 2.0, 4.0 / 3.0]
    assert forecast(S, LoadModel.parse("mean:windows=2")).tolist() == [4.0, 2.0, 0.5]
    assert forecast(S, "mean:windows=1").tolist() == [5.0, 2.0, 0.0]


def test_ewm_weights_halve_per_halflife():
    # halflife 1: weights 1/4, 1/2, 1 (oldest .. latest), sum 7/4
    got = forecast(S, LoadModel.parse("ewm:halflife=1"))
    assert np.allclose(got, [(0.25 * 1 + 0.5 * 3 + 5) / 1.75, 2.0, (0.75 + 0.5) / 1.75])


def test_quantile_and_max():
    assert forecast(S, "quantile:q=0.5").tolist() == [3.0, 2.0, 1.0]
    assert np.allclose(forecast(S, "quantile:q=0.75"), [4.0, 2.0, 2.0])
    assert forecast(S, "max").tolist() == [5.0, 2.0, 3.0]
    assert forecast(S, "max:windows=2").tolist() == [5.0, 2.0, 1.0]


def test_seasonal_same_slot_of_earlier_periods():
    series = np.arange(10, dtype=float)[:, None] * np.array([[1.0, 10.0]])
    # next window is 10; period 4: slots 6 and 2 (windows None: every period)
    assert forecast(series, "seasonal:period=4").tolist() == [4.0, 40.0]
    # windows=4 reaches one period back only: slot 6
    assert forecast(series, "seasonal:period=4,windows=4").tolist() == [6.0, 60.0]
    with pytest.raises(LoadModelError, match="needs at least 4 windows"):
        forecast(series[:3], "seasonal:period=4")


def test_robust_scenarios_are_the_last_windows():
    sc = scenarios(S, "robust:windows=2")
    assert sc.tolist() == S[1:].tolist()
    assert forecast(S, "robust:windows=2").tolist() == [4.0, 2.0, 0.5]
    assert scenarios(S, "mean").shape == (1, 3)


def test_robust_with_a_period_keeps_the_same_slot_of_earlier_periods_as_scenarios():
    series = np.arange(10, dtype=float)[:, None] * np.array([[1.0, 10.0]])
    # next window is 10; period 4: slots 6 and 2, newest first (windows None: all periods)
    assert scenarios(series, "robust:period=4").tolist() == [[6.0, 60.0], [2.0, 20.0]]
    assert forecast(series, "robust:period=4").tolist() == [4.0, 40.0]
    assert scenarios(series, "robust:period=4,windows=4").tolist() == [[6.0, 60.0]]
    assert LoadModel.parse("robust:period=4,windows=8").needs == 4
    with pytest.raises(LoadModelError, match="needs at least 4 windows"):
        scenarios(series[:3], "robust:period=4")


@pytest.mark.parametrize("text", ["mean", "mean:windows=3", "ewm:halflife=3", "quantile:q=0.9",
                                  "quantile:quantile=0.75,windows=5", "max:windows=4",
                                  "seasonal:period=7", "seasonal:windows=14,period=7", "robust",
                                  "robust:windows=3", "robust:windows=28,period=7", "auto"])
def test_parse_round_trip(text):
    model = LoadModel.parse(text)
    assert LoadModel.parse(str(model)) == model


def test_parse_spellings():
    assert LoadModel.parse("quantile:q=0.9") == LoadModel("quantile", quantile=0.9)
    assert LoadModel.parse("ewm:halflife=3").halflife == 3.0
    assert LoadModel.parse("mean:windows=3").windows == 3
    assert str(LoadModel.parse("quantile:q=0.9")) == "quantile"  # the default q
    assert str(LoadModel.parse("seasonal:period=7")) == "seasonal:period=7"


@pytest.mark.parametrize("text, message", [
    ("median", "unknown"),
    ("ewm:halflife=0", "halflife must be"),
    ("quantile:q=1.5", "quantile must be in"),
    ("mean:windows=0", "windows must be an integer >= 1"),
    ("seasonal", "needs a period"),
    ("seasonal:period=7,windows=3", "at least one period"),
    ("robust:period=7,windows=3", "robust: windows \\(3\\) must reach at least one period"),
    ("robust:period=0", "period must be an integer >= 1"),
    ("mean:halflife=2", "not one of its options"),
    ("ewm:halflife=abc", "not a number"),
    ("", "must be text"),
])
def test_refusals_name_the_field(text, message):
    with pytest.raises(LoadModelError, match=message):
        LoadModel.parse(text)


def test_auto_is_not_a_forecast():
    with pytest.raises(LoadModelError, match="choice by backtest"):
        forecast(S, "auto")


def test_every_model_is_listed():
    assert LOAD_MODELS == ("auto", "mean", "ewm", "quantile", "max", "seasonal", "robust")


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 5)),
              elements=st.floats(0, 1e6)),
       st.sampled_from(["mean", "ewm:halflife=1.5", "quantile:q=0.3", "max", "robust"]))
def test_forecast_lies_between_min_and_max_of_the_windows(series, text):
    got = forecast(series, text)
    assert got.shape == (series.shape[1],)
    assert (got >= series.min(axis=0) - 1e-6).all() and (got <= series.max(axis=0) + 1e-6).all()


def test_detect_period_finds_the_cycle_and_not_its_multiples():
    from rebalance.core.forecast import detect_period

    rng = np.random.default_rng(3)
    slots = rng.uniform(0, 10, (5, 40))  # 5 different key mixes, repeated
    series = np.vstack([slots[t % 5] for t in range(60)]) + rng.uniform(0, 1, (60, 40))
    assert detect_period(series) == 5
    assert detect_period(series, max_period=4) is None  # the cycle is out of reach
    assert detect_period(series[:10]) is None  # fewer than two cycles and a window


def test_detect_period_none_without_a_cycle():
    from rebalance.core.forecast import detect_period

    rng = np.random.default_rng(4)
    assert detect_period(np.ones((30, 8))) is None  # every lag alike: no cycle
    assert detect_period(rng.uniform(0, 1, (200, 30))) is None  # noise: no lag stands out
