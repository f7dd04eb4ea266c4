"""include/benchmarks/forecast_error.py: the per-key forecast errors it prints, on counts
whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import forecast_error


def _errors(counts: np.ndarray, period: int = 7) -> dict[str, float]:
    return {label.split(" (")[0]: value
            for label, value in forecast_error.forecast_errors(counts, period).items()}


def test_a_weekly_pattern_is_predicted_exactly_by_the_same_slot_only():
    rng = np.random.default_rng(3)
    week = rng.integers(0, 20, size=(7, 30)).astype(float)
    counts = np.tile(week, (10, 1))                     # 70 windows, the same week again
    errors = _errors(counts)
    assert errors["the same slot one period before"] == 0.0
    assert errors["the same slot, mean over the four periods before"] == 0.0
    # the mean of a whole week is the same every window and misses each day's own counts
    week_mean = week.mean(0)
    judged = range(4 * 7, 70 - 7 - 1)                  # four weeks before, a week after
    expected = np.mean([np.abs(week[t % 7] - week_mean).sum() / week[t % 7].sum()
                        for t in judged])
    assert errors["the mean of the 7 windows before"] == pytest.approx(expected)
    assert errors["the window before"] > 0


def test_constant_counts_are_predicted_exactly_by_every_forecast():
    counts = np.full((40, 5), 3.0)
    assert set(_errors(counts).values()) == {0.0}


def test_keys_that_stop_count_in_full_against_the_window_before():
    # key 0 has 10 events in every window, key 1 alternates 10 / 0: the window before is
    # wrong by 10 on key 1 every window
    counts = np.zeros((40, 2))
    counts[:, 0] = 10
    counts[::2, 1] = 10
    errors = _errors(counts, period=2)
    totals = counts.sum(axis=1)
    judged = range(8, 40 - 3 - 1)
    assert errors["the window before"] == pytest.approx(np.mean([10 / totals[t] for t in judged]))
    assert errors["the same slot one period before"] == 0.0


def test_too_few_windows_for_the_period_is_refused():
    with pytest.raises(SystemExit, match="20 windows, at least 37 needed"):
        forecast_error.forecast_errors(np.ones((20, 3)), period=7)


def test_activity_counts_events_and_new_keys():
    counts = np.zeros((20, 3))
    counts[:, 0] = 2
    counts[10:, 1] = 2                                  # key 1 appears at window 10
    stats = forecast_error.activity(counts, period=2)
    assert stats["events per window"] == pytest.approx(counts.sum(axis=1).mean())
    assert stats["largest count"] == 2
    # only window 10 has events (key 1's 2 of 4) from a key inactive in the 2 windows before
    assert stats["share of events from keys inactive in the 2 windows before"] == pytest.approx(
        (2 / 4) / 18)
