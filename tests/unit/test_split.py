"""Split placement (rebalance.core.planners.split): keys heavier than the bound spread over
several instances with shares; every figure recomputed from the plan."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rebalance import cli
from rebalance.core.model import PlanningError, PlanParams, Problem, evaluate
from rebalance.core.placement import default_instances
from rebalance.core.planners import get_planner
from rebalance.core.planners.split import SplitKeys, evaluate_split, expand, hot_keys, plan_split


def _problem(load, n, current=None, state=None, scenarios=None, drain=()):
    load = np.asarray(load, dtype=float)
    keys = np.array([f"k{i:04d}" for i in range(len(load))], dtype=object)
    default = default_instances(keys, n)
    return Problem(keys=keys, load=load,
                   state=load * 10 if state is None else np.asarray(state, dtype=float),
                   current=default if current is None else np.asarray(current),
                   default=default, n_instances=n, scenarios=scenarios, drain=drain)


def _check(problem: Problem, plan) -> None:
    """The plan's figures, recomputed: loads conserved, shares valid, metrics equal."""
    split = plan.split if plan.split is not None else SplitKeys.none()
    loads = split.loads(problem, plan.assignment)
    assert loads.sum() == pytest.approx(problem.load.sum())
    for k, inst, share in zip(split.index, split.instances, split.shares):
        assert len(inst) >= 2 and share.sum() == pytest.approx(1.0)
        assert plan.assignment[k] == inst[0] and share[0] == share.max()
    again = evaluate_split(problem, plan.assignment, split)
    assert again == plan.metrics
    assert plan.metrics.imbalance_after == pytest.approx(
        loads.max() / (problem.load.sum() / int(problem.active.sum())))
    if plan.feasible:
        assert plan.metrics.imbalance_after <= 1 + plan.params.theta + 1e-9


def test_one_key_heavier_than_the_bound_is_split_in_two_and_the_bound_is_met():
    # 3 instances, mean 5, bound 5.5 at theta 0.1: key 0 (10) alone is 2.0 mean loads.
    problem = _problem([10, 1, 1, 1, 1, 1], 3)
    params = PlanParams(theta=0.1)
    whole = get_planner("auto").plan(problem, params)
    assert not whole.feasible and whole.metrics.imbalance_after >= 2.0
    hot, need = hot_keys(problem, 0.1)
    assert hot.tolist() == [0] and need.tolist() == [2]
    plan = plan_split(problem, params)
    _check(problem, plan)
    assert plan.feasible and plan.metrics.imbalance_after <= 1.1
    assert plan.split.index.tolist() == [0] and plan.split.shares[0].tolist() == [0.5, 0.5]
    assert plan.metrics_dict()["split_keys"] == 1 and plan.split.merge_rows == 1
    # in place: one share stays where the key's state is, so the split moves no state
    assert problem.current[0] in plan.split.instances[0]
    assert not plan.moved[0]


def test_without_a_key_above_the_bound_the_plan_is_the_base_planners():
    problem = _problem(np.random.default_rng(1).integers(1, 20, 200), 4)
    params = PlanParams(theta=0.1)
    plan = plan_split(problem, params, base="mixed")
    base = get_planner("mixed").plan(problem, params)
    assert plan.split is None and plan.notes[0].startswith("split: no key above the bound")
    assert (plan.assignment == base.assignment).all() and plan.metrics == base.metrics


@pytest.mark.parametrize("seed", range(6))
def test_zipf_problems_reach_the_bound_whole_planners_cannot(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 17))
    weights = 1.0 / np.arange(1, 2001) ** rng.uniform(0.9, 1.3)
    load = rng.permutation(weights) * 1e5
    problem = _problem(load, n)
    params = PlanParams(theta=0.05, time_limit=5)
    plan = plan_split(problem, params)
    _check(problem, plan)
    floor = load.max() / problem.mean_load()
    assert floor > 1.05                      # every whole-key plan is above the bound
    assert plan.feasible, plan.notes
    hot, _ = hot_keys(problem, 0.05)
    assert set(plan.split.index.tolist()) <= set(hot.tolist())   # only keys above it


def test_scenarios_every_scenario_within_the_bound():
    rng = np.random.default_rng(3)
    base = rng.integers(1, 30, 300).astype(float)
    base[7] = 2000.0          # above the bound (1.1 x mean) in both scenarios
    scenarios = np.stack([base, base * rng.uniform(0.7, 1.3, 300)])
    problem = _problem(base, 6, scenarios=scenarios)
    plan = plan_split(problem, PlanParams(theta=0.1, time_limit=5))
    _check(problem, plan)
    assert plan.feasible and plan.split.index.tolist() == [7], plan.notes
    for row in scenarios:
        loads = plan.split.loads(problem, plan.assignment, row)
        assert loads.max() <= 1.1 * row.sum() / 6 * (1 + 1e-9)


def test_expand_keeps_the_state_on_the_first_share_only():
    problem = _problem([10, 1, 1], 3, state=[100, 5, 5])
    expanded, owner = expand(problem, np.array([0]), np.array([3]))
    assert owner.tolist() == [0, 0, 0, 1, 2]
    assert expanded.load.tolist() == pytest.approx([10 / 3] * 3 + [1, 1])
    assert expanded.state.tolist() == [100, 0, 0, 5, 5]
    assert expanded.keys[1] == ("k0000", 1) and expanded.current.tolist()[:3] == [
        problem.current[0]] * 3


def test_a_split_key_moved_off_its_instance_counts_its_state():
    problem = _problem([10, 1, 1, 1], 3, current=[0, 1, 2, 0])
    split = SplitKeys(np.array([0]), (np.array([1, 2]),), (np.array([0.5, 0.5]),))
    m = evaluate_split(problem, np.array([1, 1, 2, 0]), split)
    assert m.moved_keys == 1 and m.migration_bytes == 100
    assert m.table_size == 2 + int((np.array([1, 2, 0]) != problem.default[1:]).sum())
    stays = SplitKeys(np.array([0]), (np.array([0, 2]),), (np.array([0.5, 0.5]),))
    assert evaluate_split(problem, np.array([0, 1, 2, 0]), stays).migration_bytes == 0


@pytest.mark.parametrize("instances, shares, match", [
    ([[1]], [[1.0]], ">= 2 instances"),
    ([[1, 1]], [[0.5, 0.5]], "distinct"),
    ([[0, 1]], [[0.7, 0.7]], "sum to 1"),
    ([[0, 1]], [[1.0, 0.0]], "> 0"),
])
def test_bad_split_keys_are_refused(instances, shares, match):
    with pytest.raises(PlanningError, match=match):
        SplitKeys(np.array([0]), tuple(np.array(i) for i in instances),
                  tuple(np.array(s) for s in shares))


def test_no_split_metrics_are_the_whole_metrics():
    problem = _problem([3, 2, 1, 1], 2)
    a = problem.default
    assert evaluate_split(problem, a, SplitKeys.none()) == evaluate(problem, a)


def test_plan_split_keys_writes_the_shares_and_apply_refuses_bad_ones(tmp_path, capsys):
    rows = [{"window_start": pd.Timestamp("2026-01-01", tz="UTC"), "key": f"key-{i}",
             "count": 2000 if i == 0 else 10, "state_bytes": 100} for i in range(60)]
    h = tmp_path / "hist.parquet"
    pd.DataFrame(rows).to_parquet(h)
    out = tmp_path / "plan"
    code = cli.main(["plan", "--histograms", str(h), "--instances", "4", "--theta", "0.1",
                     "--split-keys", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "plan.json").read_text())
    assert doc["feasible"] and doc["metrics"]["imbalance_after"] <= 1.1
    assert doc["parameters"]["split_keys"] is True
    (entry,) = doc["split"]
    assert entry["key"] == "key-0" and len(entry["instances"]) >= 2
    assert sum(entry["shares"]) == pytest.approx(1.0)
    assert doc["metrics"]["split_keys"] == 1
    # apply checks the shares before it starts Spark (applying a good one:
    # tests/integration/test_apply_cli.py)
    for bad, message in ((dict(entry, shares=[0.5] * len(entry["shares"][:-1]) + [0.4]),
                          "shares sum to"),
                         (dict(entry, instances=[0, 9][:len(entry["instances"])]
                               + entry["instances"][2:]), "not an integer in [0, 4)"),
                         (dict(entry, shares=entry["shares"][:1]), "one per instance"),
                         ("key-0", "split[0] must be")):
        (out / "plan.json").write_text(json.dumps(dict(doc, split=[bad])))
        capsys.readouterr()
        assert cli.main(["apply", "--plan", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
