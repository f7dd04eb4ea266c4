"""include/benchmarks/backtest_seeds.py: pooling the synthetic traces' figures over seeds."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import backtest_seeds


def _row(seed, policy, share, mean, migration=0.01, theta_plan=0.08):
    return dict(seed=seed, policy=policy, theta_plan=theta_plan, share_within=share,
                mean_imbalance=mean, p90_imbalance=mean + 0.1, migration_per_step=migration,
                windows=180)


def test_pool_averages_each_policy_and_picks_a_grids_best_on_the_pooled_figures():
    rows = [
        _row(1, "auto", 0.10, 1.15), _row(2, "auto", 0.20, 1.13),
        # seed 1's best oracle point is 0.04, seed 2's is 0.02; pooled, 0.02 leads
        _row(1, "distribution-oracle@0.04", 0.16, 1.14, theta_plan=0.04),
        _row(2, "distribution-oracle@0.04", 0.08, 1.15, theta_plan=0.04),
        _row(1, "distribution-oracle@0.02", 0.14, 1.14, theta_plan=0.02),
        _row(2, "distribution-oracle@0.02", 0.14, 1.14, theta_plan=0.02),
        _row(1, "known-past@0.02", 0.12, 1.15, theta_plan=0.02),
        _row(2, "known-past@0.02", 0.12, 1.15, theta_plan=0.02),
    ]
    pooled = backtest_seeds.pool(pd.DataFrame(rows)).set_index("policy")
    auto = pooled.loc["auto"]
    assert auto["share_within"] == pytest.approx(0.15)
    assert auto["mean_imbalance"] == pytest.approx(1.14)
    assert auto["windows"] == 360 and auto["seeds"] == 2
    assert auto["shares"] == [0.10, 0.20]
    # the best of the pooled grid (14 %), not the mean of each seed's best (15 %)
    best = pooled.loc["distribution-oracle"]
    assert best["theta_plan"] == 0.02 and best["share_within"] == pytest.approx(0.14)
    assert pooled.loc["known-past"]["share_within"] == pytest.approx(0.12)


@pytest.mark.parametrize("argv, message", [
    (["--traces", "nyc-dest"], "traces must be synthetic"),
    (["--seeds", "1,x"], "--seeds must be distinct integers"),
    (["--seeds", "3,3"], "--seeds must be distinct integers"),
    (["--calibration-share", "1.5"], "--calibration-share must be in"),
])
def test_bad_arguments_are_refused_before_any_replay(argv, message, capsys):
    assert backtest_seeds.main(argv) == 2
    assert message in capsys.readouterr().err
