"""Evaluation harness (``rebalance bench``): workloads, the replay loop, quick mode end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rebalance.cli import main
from rebalance.core.model import PlanningError, PlanParams, Problem, evaluate
from rebalance.evaluation.experiments import Settings, build, run, summarise
from rebalance.evaluation.flux import FluxPlanner
from rebalance.evaluation.runner import PlannerSpec, interval_problem, parse_planners, replay
from rebalance.evaluation.workloads import histogram_trace, perturbation_trace, substream_trace, zipf_trace

# ------------------------------------------------------------------ workloads

def test_zipf_trace_is_deterministic_and_fluctuates():
    a = zipf_trace(2000, 8, intervals=3, seed=5)
    b = zipf_trace(2000, 8, intervals=3, seed=5)
    assert np.array_equal(a.load, b.load) and np.array_equal(a.state, b.state)
    assert a.load.shape == (3, 2000) and a.state_is_snapshot
    assert np.array_equal(a.initial, a.default)           # empty routing table at start
    # seed 003's fluctuation: some instance's load changes by >= f mean loads
    loads = np.stack([np.bincount(a.default, weights=row, minlength=8) for row in a.load])
    change = np.abs(np.diff(loads, axis=0)).max(axis=1) / loads[0].mean()
    assert (change >= 1.0 - 1e-9).all()
    assert not np.array_equal(zipf_trace(2000, 8, intervals=3, seed=6).load, a.load)


def test_perturbation_trace_moves_20_percent_of_nodes():
    tr = perturbation_trace(20, 400, intervals=3, varies=0.6, seed=1)
    assert tr.n_keys == 400 and np.array_equal(tr.key_group, np.arange(400))
    assert np.bincount(tr.initial, minlength=20).tolist() == [20] * 20   # evenly allocated
    for row in tr.load:
        node = np.bincount(tr.initial, weights=row, minlength=20) / 20
        changed = np.abs(node - 1.0) > 0.1          # beyond the +/- 5 % base spread
        assert changed.sum() == 4                   # 20 % of 20 nodes
        assert np.isclose(node[changed].max(), 1.3, atol=0.06)
        assert np.isclose(node[changed].min(), 0.7, atol=0.06)
    assert (tr.state == 1).all()                    # migration counted in key groups


def test_substream_traces_have_equal_means_and_zipf_is_more_skewed():
    g = substream_trace("gaussian", 100, 10, intervals=30, seed=2)
    z = substream_trace("zipf", 100, 10, intervals=30, seed=2)
    assert abs(g.load.sum() / z.load.sum() - 1) < 0.01        # same Poisson rate
    assert z.load.var(axis=1).mean() > g.load.var(axis=1).mean()
    assert np.allclose(g.state, 0.1 * g.load)                  # state = rate / 10
    with pytest.raises(PlanningError):
        substream_trace("uniform", 10, 2, intervals=3)


def test_histogram_trace_from_parquet(tmp_path):
    rows = []
    for w, ts in enumerate(pd.date_range("2026-01-01", periods=3, freq="10s")):
        for k in range(20):
            if k == 19 and w == 0:
                continue                      # a key that appears later
            rows.append(dict(window_start=ts, key=f"k{k}", count=10 + k * (w + 1),
                             cost=float(10 + k * (w + 1)), state_bytes=100 * (k + 1)))
    frame = pd.DataFrame(rows)
    path = tmp_path / "hist.parquet"
    frame.to_parquet(path)
    from rebalance.core.histogram_files import read_histogram_table
    tr = histogram_trace(read_histogram_table(str(path)), 4)
    assert tr.load.shape == (3, 20) and tr.state_is_snapshot
    i = list(tr.keys).index("k19")
    assert tr.load[0, i] == 0 and tr.load[2, i] == 10 + 19 * 3
    assert tr.state[1, i] == 2000
    # the planned problem of interval 1 is exactly the histogram problem of window 0
    from rebalance.core.histograms import problem_from_histograms
    ref = problem_from_histograms(frame[frame["window_start"] == frame["window_start"].min()], 4)
    problem, _ = interval_problem(tr, 1, tr.initial.copy())
    assert list(problem.keys) == list(ref.keys)
    assert np.allclose(problem.load, ref.load) and np.allclose(problem.state, ref.state)
    assert np.array_equal(problem.default, ref.default)


# ------------------------------------------------------------------ replay loop

@pytest.mark.parametrize("planner", ["greedy", "mixed", "flux", "elb", "hash"])
def test_replay_carries_assignment_and_metrics_recompute(planner):
    tr = zipf_trace(1500, 6, intervals=5, seed=3)
    params = PlanParams(theta=0.08, max_table=200)
    rows = replay(tr, parse_planners(planner), params, keep_plans=True)
    assert [r["interval"] for r in rows] == [1, 2, 3, 4]
    assignment = tr.initial.copy()
    for r in rows:
        problem, plan, pos = r["_problem"], r["_plan"], r["_positions"]
        # the current assignment of interval t is the plan of interval t-1
        assert np.array_equal(problem.current, assignment[pos])
        # the reported metrics are the recomputed ones
        m = evaluate(problem, plan.assignment)
        assert m == plan.metrics
        assert r["imbalance_after"] == m.imbalance_after
        assert r["migration_fraction"] == m.migration_fraction
        assert r["moved_keys"] == m.moved_keys and r["table_size"] == m.table_size
        assert r["gap"] == pytest.approx(m.migration_fraction - plan.lower_bound_fraction)
        assignment[pos] = plan.assignment
        realised = np.bincount(assignment, weights=tr.load[r["interval"]], minlength=6)
        assert r["imbalance_next"] == pytest.approx(realised.max() / realised.mean())


def test_replay_period_holds_between_rebalances():
    tr = substream_trace("zipf", 40, 4, intervals=9, seed=1)
    rows = replay(tr, [PlannerSpec("clb", period=4)], PlanParams(theta=0.1), keep_plans=True)
    rebalanced = [r["interval"] for r in rows if r["rebalanced"]]
    assert rebalanced == [4, 8]
    for r in rows:
        if not r["rebalanced"]:
            assert r["moved_keys"] == 0 and r["migration_fraction"] == 0
        else:   # CLB gets the load series of the last 4 windows
            assert r["_problem"].load_series.shape == (4, 40)
    assert rows[0]["_problem"].load_series is not None


def test_same_data_for_every_planner():
    tr = perturbation_trace(10, 100, intervals=3, varies=0.4, seed=0)
    rows = replay(tr, parse_planners("flux,greedy,hash"), PlanParams(theta=0.01, budget_keys=5))
    first = [r for r in rows if r["interval"] == 1]
    assert len({round(r["imbalance_before"], 12) for r in first}) == 1


def test_flux_moves_heaviest_suitable_key_within_budget():
    # loads 10/2/0 on three instances; keys: a=6, b=3, c=1 on 0; d=2 on 1
    problem = Problem(keys=["a", "b", "c", "d"], load=[6, 3, 1, 2], state=[1, 1, 1, 1],
                      current=[0, 0, 0, 1], default=[0, 0, 0, 1], n_instances=3)
    plan = FluxPlanner().plan(problem, PlanParams(theta=0.01, budget_keys=1))
    assert plan.metrics.moved_keys == 1 and plan.assignment.tolist() == [2, 0, 0, 1]
    plan = FluxPlanner().plan(problem, PlanParams(theta=0.01))
    loads = problem.instance_loads(plan.assignment)
    assert loads.max() == 6 and plan.metrics.imbalance_after == pytest.approx(1.5)


def test_parse_planners_rejects_unknown():
    assert [s.label for s in parse_planners("mixed,clb@24,flux")] == ["mixed", "clb@24", "flux"]
    with pytest.raises(PlanningError, match="unknown planner"):
        parse_planners("mixed,readj")
    with pytest.raises(PlanningError):
        parse_planners("clb@0")


def test_summary_amortises_migration():
    settings = Settings(intervals=3)
    points = build("quick", settings)
    results = run("quick", points[2:])           # the seed 001 point: clb every 3 windows
    summary = summarise(results)
    clb = summary[summary["planner"] == "clb@3"].iloc[0]
    rows = results[results["planner"] == "clb@3"]
    assert clb["rebalances"] == rows["rebalanced"].sum() == 2
    assert clb["migration_fraction"] == pytest.approx(rows["migration_fraction"].sum() / len(rows))


# ------------------------------------------------------------------ end to end

def test_quick_bench_end_to_end(tmp_path, capsys):
    code = main(["bench", "--experiment", "quick", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "imbalance_after" in out and "migration_fraction" in out
    for name in ("mixed", "milp", "flux", "elb", "clb@4"):
        assert name in out
    results = pd.read_csv(tmp_path / "results.csv")
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert {"planner", "interval", "imbalance_after", "migration_fraction", "moved_keys",
            "table_size", "plan_seconds", "lower_bound_fraction", "gap"} <= set(results.columns)
    assert set(summary["point"]) == {0, 1, 2}
    pngs = list(tmp_path.glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
    # planners that rebalance beat doing nothing on the planned window
    s = summary[summary["sweep"] == "zipf"].set_index("planner")
    assert s.loc["mixed", "imbalance_after"] < s.loc["hash", "imbalance_after"]


def test_bench_replay_parquet(tmp_path, capsys):
    rng = np.random.default_rng(0)
    rows = []
    for ts in pd.date_range("2026-01-01", periods=4, freq="10s"):
        counts = rng.zipf(1.6, size=200).clip(max=500)
        for k, c in enumerate(counts):
            rows.append(dict(window_start=ts, key=f"user{k}", count=int(c), cost=float(c),
                             state_bytes=int(64 * c)))
    path = tmp_path / "hist"
    path.mkdir()
    pd.DataFrame(rows).to_parquet(path / "part-0.parquet")
    code = main(["bench", "--experiment", "replay", "--histograms", str(path), "--instances", "4",
                 "--planners", "hash,greedy,mixed", "--out", str(tmp_path / "out"),
                 "--no-progress", "--no-plots"])
    assert code == 0
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(results) == 3 * 3 and set(results["planner"]) == {"hash", "greedy", "mixed"}


def test_bench_errors_are_one_line(tmp_path, capsys):
    assert main(["bench", "--experiment", "replay", "--out", str(tmp_path)]) == 2
    assert "needs --histograms" in capsys.readouterr().err
    assert main(["bench", "--planners", "nope", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown planner" in err


def test_bench_scale_runs_the_whole_command_and_plots_time_against_k(tmp_path, capsys):
    """``rebalance bench --experiment scale`` on two tiny K: one plan process per point."""
    out = tmp_path / "scale"
    code = main(["bench", "--experiment", "scale", "--keys", "200,400", "--runs", "1",
                 "--planners", "mixed", "--out", str(out), "--workdir", str(tmp_path / "in"),
                 "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4  # 2 K x 2 placements x 1 method
    assert set(summary["placement"]) == {"default", "assignment"}
    assert (summary["failed"] == 0).all()
    for col in ("wall", "input_seconds", "plan_seconds", "peak_mb", "imbalance", "migration"):
        assert summary[col].notna().all(), col
    assert (summary["wall"] >= summary["plan_seconds"]).all()
    assert (out / "scale.png").stat().st_size > 1000
    assert "| K | placement | method | wall s" in printed
    # the inputs are kept for the next run
    assert (tmp_path / "in" / "K200" / "histograms.parquet").exists()


def test_bench_scale_refuses_bad_keys(capsys):
    assert main(["bench", "--experiment", "scale", "--keys", "ten"]) == 2
    assert "--keys" in capsys.readouterr().err


def test_bench_takes_the_experiments_by_name_and_refuses_a_former_name(tmp_path, capsys):
    """``rebalance bench`` lists the harness's experiments (and scale); a former name
    (seed001-elb-clb, now elb-clb: docs/evaluation.md) is refused with the names there are."""
    from rebalance.cli import evaluate as cli_bench
    from rebalance.evaluation import experiments as ex

    assert cli_bench.EXPERIMENTS == (*ex.EXPERIMENTS, "scale")
    assert main(["bench", "--experiment", "seed001-elb-clb", "--intervals", "2",
                 "--out", str(tmp_path / "old")]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'seed001-elb-clb'" in err and "elb-clb" in err
    assert not (tmp_path / "old").exists()
    with pytest.raises(PlanningError, match="unknown experiment 'seed001-elb-clb'"):
        build("seed001-elb-clb", Settings(intervals=2))
    code = main(["bench", "--experiment", "elb-clb", "--intervals", "2",
                 "--planners", "hash", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    capsys.readouterr()
    assert set(pd.read_csv(tmp_path / "results.csv")["experiment"]) == {"elb-clb"}
    assert {p.name for p in tmp_path.glob("*.png")} == {"elb_clb_variance.png",
                                                         "elb_clb_movement.png"}
    assert main(["bench", "--help"]) == 0
    usage = capsys.readouterr().out
    assert "--experiment {quick,zipf-sweeps,migration-budgets,elb-clb,hash-routings," in usage
