"""``rebalance plan`` with default options chooses a load model from the windows it is given,
and ``rebalance backtest`` prints and writes its tables (in-process CLI calls)."""

import json

import numpy as np
import pandas as pd
import pytest

from rebalance.cli import main
from rebalance.core.defaults import DEFAULT_THETA


def _histograms(path, windows=10, keys=30, seed=5, flip=False):
    rng = np.random.default_rng(seed)
    base = rng.uniform(1, 30, keys).round()
    rows = []
    for w in range(windows):
        load = base if not flip else (base if w % 2 == 0 else base[::-1])
        for k in range(keys):
            rows.append((pd.Timestamp("2024-01-01") + pd.Timedelta(hours=w), f"key{k:02d}",
                         int(load[k] * (1 + 0.02 * ((w * 7 + k) % 3 - 1))) + 1,
                         int(100 + k)))
    frame = pd.DataFrame(rows, columns=["window_start", "key", "count", "state_bytes"])
    frame.to_parquet(path)
    return frame


def test_plan_default_chooses_a_load_model_and_records_why(tmp_path, capsys):
    hist = tmp_path / "h.parquet"
    _histograms(hist)
    out = tmp_path / "plan"
    assert main(["plan", "--histograms", str(hist), "--instances", "4", "--out", str(out)]) == 0
    doc = json.loads((out / "plan.json").read_text())
    lm = doc["load_model"]
    assert lm["requested"] == "auto"
    assert lm["windows_backtested"] == 10
    assert lm["chosen"] != "auto" and lm["reason"]
    assert 0 < lm["theta_plan"] <= DEFAULT_THETA
    assert len(lm["candidates"]) >= 3
    assert all("share_within" in c for c in lm["candidates"])
    if not lm["stay"]:
        assert doc["metrics"]["imbalance_after"] <= 1 + lm["theta_plan"] + 1e-6
    assert "plan auto" in capsys.readouterr().out


def test_plan_with_one_window_falls_back_to_todays_mean(tmp_path):
    hist = tmp_path / "h.parquet"
    _histograms(hist, windows=1)
    out = tmp_path / "plan"
    assert main(["plan", "--histograms", str(hist), "--instances", "4", "--out", str(out)]) == 0
    lm = json.loads((out / "plan.json").read_text())["load_model"]
    assert lm["chosen"] == "mean:windows=1" and "too few to backtest" in lm["reason"]
    assert lm["windows_backtested"] == 1
    assert lm["theta_plan"] == DEFAULT_THETA


def test_plan_over_every_window_given_plans_on_their_mean(tmp_path):
    """--windows W with W windows given: every candidate auto would try plans on all of
    them, none is left to judge on; auto plans on their mean (it does not stay with the
    imbalanced assignment, which validation would then reject)."""
    hist = tmp_path / "h.parquet"
    _histograms(hist, windows=3)
    out = tmp_path / "plan"
    assert main(["plan", "--histograms", str(hist), "--instances", "4", "--windows", "3",
                 "--out", str(out)]) == 0
    doc = json.loads((out / "plan.json").read_text())
    lm = doc["load_model"]
    assert lm["chosen"] == "mean:windows=3" and lm["stay"] is False
    assert "every candidate plans on 3" in lm["reason"], lm["reason"]
    assert doc["metrics"]["imbalance_after"] <= 1.08 + 1e-6 < doc["metrics"]["imbalance_before"]


def test_plan_explicit_model_and_theta_plan(tmp_path):
    hist = tmp_path / "h.parquet"
    _histograms(hist)
    out = tmp_path / "plan"
    assert main(["plan", "--histograms", str(hist), "--instances", "4", "--out", str(out),
                 "--load-model", "robust:windows=3", "--theta-plan", "0.02"]) == 0
    doc = json.loads((out / "plan.json").read_text())
    assert doc["load_model"]["chosen"] == "robust:windows=3"
    assert doc["load_model"]["theta_plan"] == 0.02
    assert doc["input"]["windows_used"] == 3


@pytest.mark.parametrize("extra, message", [
    (["--load-model", "median"], "--load-model: load model 'median'"),
    (["--theta-plan", "0.5"], f"--theta-plan must be in (0, --theta = {DEFAULT_THETA}]"),
    (["--headroom-target", "2"], "--headroom-target must be a share in (0, 1]"),
])
def test_plan_refuses_bad_load_model_options(tmp_path, capsys, extra, message):
    hist = tmp_path / "h.parquet"
    _histograms(hist, windows=2)
    out = tmp_path / "plan"
    code = main(["plan", "--histograms", str(hist), "--instances", "4", "--out", str(out), *extra])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not out.exists()


def test_backtest_command_prints_and_writes(tmp_path, capsys):
    hist = tmp_path / "h.parquet"
    _histograms(hist, windows=8)
    out = tmp_path / "bt"
    code = main(["backtest", str(hist), "--instances", "4", "--theta", "0.1",
                 "--policies", "mean:windows=1", "mean:windows=1@0.025", "robust:windows=2",
                 "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    for name in ("mean:windows=1@0.025", "robust:windows=2", "none", "stay", "oracle",
                 "distribution-oracle"):
        assert name in printed
    steps = pd.read_csv(out / "steps.csv")
    summary = pd.read_csv(out / "summary.csv")
    assert set(steps["policy"]) >= {"mean:windows=1", "stay", "oracle"}
    assert (summary.set_index("policy").loc["oracle", "share_within"]) == 1.0
    assert (out / "imbalance.png").stat().st_size > 1000


def test_backtest_command_refuses_a_bad_policy(tmp_path, capsys):
    hist = tmp_path / "h.parquet"
    _histograms(hist, windows=3)
    code = main(["backtest", str(hist), "--instances", "4", "--theta", "0.1",
                 "--policies", "mean@x"])
    assert code == 2
    assert "theta_plan 'x' is not a number" in capsys.readouterr().err


def test_plan_auto_on_more_cells_than_a_backtest_replays_plans_on_the_mean(tmp_path):
    """12 000 windows x 12 000 keys (each key in one window) is above the 2^27 cells a
    replay may hold: the default auto plans as today (mean of --windows) and says why,
    where it refused the whole input (issue 23, row 13)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 12_000
    starts = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.arange(n), unit="min")
    pq.write_table(pa.table({"window_start": starts, "key": [f"k{i}" for i in range(n)],
                             "count": np.ones(n, dtype=np.int64)}), tmp_path / "h.parquet")
    out = tmp_path / "plan"
    assert main(["plan", "--histograms", str(tmp_path / "h.parquet"), "--instances", "4",
                 "--out", str(out)]) == 0
    lm = json.loads((out / "plan.json").read_text())["load_model"]
    assert lm["chosen"] == "mean:windows=1" and lm["windows_backtested"] == 0
    assert "144000000 cells are too many to backtest" in lm["reason"], lm["reason"]
