"""Baselines: hash (no rebalancing) and LPT (full re-pack)."""

from __future__ import annotations

import numpy as np

from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners import get_planner

PARAMS = PlanParams(theta=0.1)


def problem_with(load, current, default, n_instances, drain=()) -> Problem:
    return Problem(keys=np.array([f"k{i}" for i in range(len(load))], dtype=object),
                   load=load, state=np.ones(len(load)), current=current, default=default,
                   n_instances=n_instances, drain=frozenset(drain))


def test_hash_keeps_every_key_in_place():
    problem = problem_with([5, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 0], 2)
    plan = get_planner("hash").plan(problem, PARAMS)
    np.testing.assert_array_equal(plan.assignment, problem.current)
    assert plan.metrics.moved_keys == 0


def test_hash_rehomes_keys_that_must_move():
    # k0, k1 sit on removed instance 3; k2 on drained instance 2; k1's default is drained.
    problem = problem_with([4, 3, 2, 1, 1], [3, 3, 2, 0, 1], [1, 2, 0, 0, 1], 3, drain=(2,))
    plan = get_planner("hash").plan(problem, PARAMS)
    assert plan.assignment[0] == 1 and plan.assignment[2] == 0  # their default instances
    assert plan.assignment[1] == 0                              # least-loaded active (3 < 5)
    assert plan.assignment[3:].tolist() == [0, 1]
    assert any("default instance" in note for note in plan.notes)


def test_lpt_repacks_heaviest_first_on_least_loaded():
    problem = problem_with([3, 2, 3, 2, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0], 2)
    plan = get_planner("lpt").plan(problem, PARAMS)
    # 3 -> d0, 3 -> d1, then 2s: d0 (tie, lower index), d1, d0.
    assert plan.assignment.tolist() == [0, 0, 1, 1, 0]
    assert problem.instance_loads(plan.assignment).tolist() == [7, 5]


def test_lpt_ignores_current_placement_and_drained_instances():
    rng = np.random.default_rng(4)
    k, n = 1000, 5
    problem = problem_with(rng.random(k) + 0.5, rng.integers(0, n, k), rng.integers(0, n, k), n,
                           drain=(4,))
    plan = get_planner("lpt").plan(problem, PARAMS)
    assert not (plan.assignment == 4).any()
    assert plan.metrics.imbalance_after < 1.01
    assert plan.metrics.moved_keys > k / 2
    again = get_planner("lpt").plan(problem, PARAMS)
    np.testing.assert_array_equal(plan.assignment, again.assignment)
