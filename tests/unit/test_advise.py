"""``advise``: the theta a job can keep, worked by hand on small histories, and
``rebalance advise`` on a CSV of windows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rebalance import cli
from rebalance.core.backtest import BacktestError, Policy, WindowHistory, backtest
from rebalance.core.backtest.advise import advise

KEYS = np.array(["hot", "b", "c", "d"], dtype=object)
DEFAULT = np.array([0, 0, 1, 1])     # {hot, b} on instance 0, {c, d} on instance 1
GRID = (0.1, 0.25, 0.5, 1.0)


def _history(loads, default=DEFAULT, n=2):
    loads = np.asarray(loads, dtype=float)
    return WindowHistory(keys=KEYS, window_starts=np.arange(len(loads)), loads=loads,
                         state=loads, default=default, n_instances=n)


def test_a_key_heavier_than_theta_allows_puts_theta_out_of_reach():
    # hot = 3 of a total 6 over N = 2: mean 3, and the instance holding hot carries at
    # least 3 + its share of the rest. Best: {hot} / {b, c, d} = 3 / 3 -> imbalance 1, but
    # hot = 4 of 6 (mean 3): max >= 4, imbalance >= 4/3 whatever the plan.
    h = _history([[4, 1, 0.5, 0.5]] * 6)
    a = advise(h, 0.1, Policy.of("mean:windows=1"), thetas=GRID)
    assert not a.reachable and a.attainable == 0.5     # 4/3 <= 1.5; not <= 1.25
    row = a.at_theta
    assert row.share_within == 0 and row.mean_imbalance == pytest.approx(4 / 3)
    assert row.mean_stay_imbalance == pytest.approx(5 / 3)   # {hot, b} = 5 of 6 by default
    assert a.critical_path_gain == pytest.approx(1 - (4 / 3) / (5 / 3))
    assert a.stay_attainable == 1.0
    text = "\n".join(a.lines())
    assert "theta 0.1 is out of reach: plans keep 0% of the following windows" in text
    assert "the smallest theta that holds: 0.5" in text
    assert "the busiest instance carries 20.0% less than staying" in text


def test_each_theta_is_the_backtest_at_that_theta():
    rng = np.random.default_rng(4)
    h = _history(rng.uniform(0.5, 3, size=(12, 4)))
    policy = Policy.of("mean:windows=1")
    a = advise(h, 0.2, policy, thetas=(0.05, 0.5))
    assert list(a.table["theta"]) == [0.05, 0.2, 0.5]
    for theta in (0.05, 0.2, 0.5):
        r = backtest(h, [policy], theta, baselines=("none",))   # none: the default kept
        row = a.table[a.table["theta"] == theta].iloc[0]
        assert row.share_within == r.row(policy.name).share_within
        assert row.stay_share_within == r.row("none").share_within
        assert row.mean_stay_imbalance == pytest.approx(r.row("none").mean_imbalance)
        assert row.migration_per_step == r.row(policy.name).migration_per_step
    assert a.table["stay_share_within"].nunique() > 1 and a.table["share_within"].nunique() > 1


def test_a_theta_plans_keep_is_reached_and_staying_is_said_when_it_suffices():
    even = _history([[1, 1, 1, 1]] * 4)          # default already even
    a = advise(even, 0.1, Policy.of("mean:windows=1"), thetas=GRID)
    assert a.reachable and a.attainable == 0.1 and a.stay_attainable == 0.1
    text = "\n".join(a.lines())
    assert "theta 0.1 holds" in text and "staying on the current assignment already" in text
    assert "plans do not pay here" in text


def test_refusals_are_one_line():
    h = _history([[1, 1, 1, 1]] * 3)
    policy = Policy.of("mean:windows=1")
    for kwargs, message in [
        (dict(theta=0), "theta must be a number > 0"),
        (dict(theta=0.1, target=1.5), r"target share must be in \(0, 1\]"),
        (dict(theta=0.1, thetas=(0.1, -1)), "a theta to try must be a number > 0"),
    ]:
        with pytest.raises(BacktestError, match=message):
            advise(h, policy=policy, **kwargs)
    with pytest.raises(BacktestError, match="none is left to judge a plan on"):
        advise(_history([[1, 1, 1, 1]]), 0.1, policy)


def _csv(tmp_path, loads):
    rows = [(f"2026-01-{w + 1:02d}T00:00:00", k, v) for w, window in enumerate(loads)
            for k, v in zip(KEYS, window) if v]
    path = tmp_path / "windows.csv"
    pd.DataFrame(rows, columns=["window_start", "key", "count"]).to_csv(path, index=False)
    return path


def test_the_command_prints_the_advice_and_writes_the_table(tmp_path, capsys):
    path = _csv(tmp_path, [[40, 10, 5, 5]] * 8)
    out = tmp_path / "out"
    code = cli.main(["advise", str(path), "--instances", "2", "--theta", "0.1",
                     "--load-model", "mean:windows=1", "--thetas", "0.25", "0.5", "1",
                     "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "8 windows of 4 keys" in printed
    assert "theta 0.1 is out of reach" in printed
    assert "the smallest theta that holds: 0.5" in printed
    table = pd.read_csv(out / "advice.csv")
    assert list(table["theta"]) == [0.1, 0.25, 0.5, 1.0]


@pytest.mark.parametrize("argv, message", [
    (["--instances", "0"], "--instances must be in [1,"),
    (["--instances", "2", "--theta", "0"], "--theta must be a number > 0"),
    (["--instances", "2", "--target", "0"], "--target must be a share in (0, 1]"),
    (["--instances", "2", "--history", "0"], "--history must be >= 1"),
    (["--instances", "2", "--thetas", "0.1", "nan"], "--thetas must be a number > 0"),
    (["--instances", "2", "--load-model", "bogus"], "unknown"),
])
def test_the_command_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    path = _csv(tmp_path, [[4, 1, 1, 1]] * 3)
    assert cli.main(["advise", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_until_one_holds_tries_theta_then_larger_ones_and_stops_at_the_first_that_holds():
    h = _history([[4, 1, 0.5, 0.5]] * 6)          # holds from 0.5 on (first test)
    a = advise(h, 0.1, Policy.of("mean:windows=1"), thetas=GRID, until_one_holds=True)
    assert list(a.table["theta"]) == [0.1, 0.25, 0.5] and a.attainable == 0.5
    held = advise(h, 0.5, Policy.of("mean:windows=1"), thetas=GRID, until_one_holds=True)
    assert list(held.table["theta"]) == [0.5] and held.reachable
