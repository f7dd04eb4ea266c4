"""Robust multi-window planning (Problem.scenarios) in the heuristics."""

import numpy as np
import pytest

from rebalance.core.model import PlanningError, PlanParams, Problem, evaluate, imbalance
from rebalance.core.planners import get_planner

KEYS = np.array(["a", "b", "c", "d"], dtype=object)
# two windows: the mean is even (1, 1, 1, 1) but each window loads one pair
SCENARIOS = np.array([[2.0, 0.0, 2.0, 0.0],
                      [0.0, 2.0, 0.0, 2.0]])
DEFAULT = np.array([0, 1, 0, 1])   # {a, c} and {b, d}: the mean is balanced, each window not


def _problem(scenarios=None):
    return Problem(keys=KEYS, load=SCENARIOS.mean(axis=0), state=np.ones(4), current=DEFAULT,
                   default=DEFAULT, n_instances=2, scenarios=scenarios)


def test_mean_plan_breaks_a_window_the_robust_plan_keeps():
    params = PlanParams(theta=0.08)
    mean_plan = get_planner("mixed").plan(_problem(), params)
    assert mean_plan.metrics.moved_keys == 0           # the mean looks balanced
    robust = _problem(SCENARIOS)
    # judged on the windows, the mean plan has imbalance 2 in each
    assert imbalance(robust.scenario_loads(mean_plan.assignment), robust.active).tolist() \
        == pytest.approx([2.0, 2.0])
    for method in ("mixed", "greedy", "auto"):
        plan = get_planner(method).plan(robust, params)
        assert plan.feasible, (method, plan.notes)
        assert imbalance(robust.scenario_loads(plan.assignment)).max() == pytest.approx(1.0)
        assert plan.metrics.imbalance_after == pytest.approx(1.0)
        assert plan.metrics.imbalance_before == pytest.approx(2.0)
        assert plan.metrics.moved_keys == 2   # one key of each pair swaps


def test_one_scenario_equals_the_load_and_no_scenarios_keeps_behaviour():
    rng = np.random.default_rng(3)
    k = 60
    load = rng.gamma(2.0, 1.0, k)
    keys = np.array([f"k{i:02d}" for i in range(k)], dtype=object)
    cur = rng.integers(0, 4, k)
    plain = Problem(keys=keys, load=load, state=np.ones(k), current=cur, default=cur,
                    n_instances=4)
    one = Problem(keys=keys, load=load, state=np.ones(k), current=cur, default=cur,
                  n_instances=4, scenarios=load[None, :])
    params = PlanParams(theta=0.05)
    for method in ("mixed", "greedy"):
        p = get_planner(method).plan(plain, params)
        r = get_planner(method).plan(one, params)
        assert "robust" not in " ".join(p.notes)
        assert r.feasible
        assert evaluate(one, r.assignment).imbalance_after <= 1.05 + 1e-9


def test_scenarios_shape_and_values_are_checked():
    with pytest.raises(PlanningError, match=r"scenarios must have shape \(S >= 1, 4\)"):
        _problem(np.ones((2, 3)))
    bad = SCENARIOS.copy()
    bad[1, 2] = -1
    with pytest.raises(PlanningError, match=r"key 'c' has -1\.0 in scenario 1"):
        _problem(bad)


def test_robust_drains_and_unreachable_bound():
    # a key heavier than any bound: the plan keeps the least peak and says so
    sc = np.array([[10.0, 1.0, 1.0, 1.0], [9.0, 1.0, 1.0, 2.0]])
    p = Problem(keys=KEYS, load=sc.mean(axis=0), state=np.ones(4), current=np.array([0, 0, 0, 0]),
                default=np.array([0, 0, 0, 0]), n_instances=2, scenarios=sc)
    plan = get_planner("mixed").plan(p, PlanParams(theta=0.1))
    # the heavy key alone on one instance, the rest on the other
    a = plan.assignment
    assert (a[1:] != a[0]).all()
    drained = Problem(keys=KEYS, load=SCENARIOS.mean(axis=0), state=np.ones(4),
                      current=np.array([0, 1, 2, 2]), default=DEFAULT, n_instances=3,
                      drain=frozenset({2}), scenarios=SCENARIOS)
    plan = get_planner("mixed").plan(drained, PlanParams(theta=0.08))
    assert not np.isin(plan.assignment, [2]).any()


def test_robust_milp_keeps_every_window_and_moves_least():
    params = PlanParams(theta=0.08, time_limit=5)
    plan = get_planner("milp").plan(_problem(SCENARIOS), params)
    assert plan.feasible, plan.notes
    assert plan.metrics.moved_keys == 2
    assert any("robust MILP over 2 scenario(s)" in n for n in plan.notes)


def test_robust_milp_migrates_less_than_the_robust_llfd():
    # 3 windows, 9 keys, N = 3
    rng = np.random.default_rng(11)
    sc = rng.integers(1, 10, (3, 9)).astype(float)
    keys = np.array([f"k{i}" for i in range(9)], dtype=object)
    cur = np.zeros(9, dtype=np.int64)
    p = Problem(keys=keys, load=sc.mean(axis=0), state=rng.integers(1, 5, 9).astype(float),
                current=cur, default=cur, n_instances=3, scenarios=sc)
    params = PlanParams(theta=0.2, time_limit=5)
    llfd = get_planner("mixed").plan(p, params)
    milp = get_planner("milp").plan(p, params)
    assert llfd.feasible and milp.feasible
    # the heuristic moves 17 bytes; the MILP proves 9 optimal (the integer cover bound)
    assert llfd.metrics.migration_bytes == 17
    assert milp.metrics.migration_bytes == 9
    assert milp.lower_bound_bytes == pytest.approx(9, rel=1e-5)
