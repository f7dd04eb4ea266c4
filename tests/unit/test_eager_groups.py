"""ELB planner (seed 001, Algorithm 1, fixed) over key groups."""

from __future__ import annotations

import numpy as np
from helpers_milp import make_problem, zipf_problem

from rebalance.core.model import PlanParams
from rebalance.core.placement import key_groups
from rebalance.core.planners import get_planner
from rebalance.core.planners.eager_groups import KeyGroups, balance


def plan(problem, theta=0.5):
    return get_planner("elb").plan(problem, PlanParams(theta=theta))


def grouped(loads_by_instance, n_instances, drain=()):
    """One key per group; ``loads_by_instance[i]`` lists the group loads on instance i."""
    load = [x for loads in loads_by_instance for x in loads]
    current = [i for i, loads in enumerate(loads_by_instance) for _ in loads]
    return make_problem(load, np.ones(len(load)), current, n_instances, drain,
                        key_group=np.arange(len(load)))


def test_detaches_below_the_shrinking_threshold_and_places_largest_first():
    # Mean 6, theta 0.5: u = 9, v = 3, (u - v) / 2 = 3. Instance 0 (11) skips 5 and 3
    # (not below min(11 - 6, 3) = 3), detaches 2 (now 9, threshold 3) and 1 (now 8).
    # Largest first: 2 goes to instance 2 (load 3), then 1 to instance 1 (load 4).
    problem = grouped([[5, 3, 2, 1], [2, 2], [3]], 3)
    result = plan(problem)
    assert result.assignment.tolist() == [0, 0, 2, 1, 1, 1, 2]
    assert problem.instance_loads(result.assignment).tolist() == [8, 5, 5]
    assert any("ELB: 2 group(s) detached" in n for n in result.notes)


def test_keys_of_a_group_move_together_and_split_groups_are_consolidated():
    # Group 7 has most of its load on instance 1: its key on instance 0 joins it there.
    problem = make_problem([4, 1, 1, 6, 3], np.ones(5), [0, 0, 1, 1, 0], 2,
                           key_group=[7, 8, 7, 7, 9])
    result = plan(problem, theta=0.2)
    assert result.assignment.tolist() == [1, 0, 1, 1, 0]
    assert any("1 key(s) away from their group's majority instance" in n for n in result.notes)


def test_groups_default_to_spark_key_groups():
    problem = zipf_problem(3000, 4, seed=1)
    result = plan(problem, theta=0.1)
    groups = key_groups(problem.keys)
    for g in np.unique(groups):
        assert len(np.unique(result.assignment[groups == g])) == 1
    assert result.metrics.imbalance_after < result.metrics.imbalance_before


def test_drained_and_removed_instances_are_emptied():
    problem = grouped([[4, 3], [2, 2], [3, 1], [2]], 3, drain=(2,))
    result = plan(problem)
    assert not np.isin(result.assignment, [2]).any()
    assert result.moved[problem.must_move()].all()
    assert any("3 taken off drained/removed" in n for n in result.notes)


def test_scale_out_fills_the_new_instance():
    problem = grouped([[3, 3, 2, 1, 1], [3, 2, 2, 1, 1, 1]], 3)
    result = plan(problem, theta=0.2)
    assert problem.instance_loads(result.assignment)[2] > 0
    assert result.metrics.imbalance_after < result.metrics.imbalance_before


def test_group_no_instance_can_hold_goes_to_the_least_loaded_with_a_note():
    # The drained instance's group (8) fits under no u = 1.1 * 8: fix, least-loaded takes it.
    problem = grouped([[7], [5, 4], [8]], 3, drain=(2,))
    result = plan(problem, theta=0.1)
    assert result.assignment[3] == 0
    assert any("exceeded u" in n for n in result.notes)


def test_zero_load_moves_only_what_must_move():
    problem = make_problem([0, 0, 0], [1, 1, 1], [0, 1, 2], 3, drain=(2,),
                           key_group=[0, 1, 2])
    result = plan(problem)
    assert result.moved.tolist() == [False, False, True]
    assert any("no load" in n for n in result.notes)


def test_without_the_cap_heavy_units_move_too():
    # Mean 4.5: with the cap (theta * mean = 0.45) nothing on instance 0 (8) is light
    # enough; without it, 3 < 8 - 4.5 is detached and placed on instance 1.
    load, owner = np.array([5.0, 3.0, 1.0]), np.array([0, 0, 1])
    assert balance(load, owner, np.arange(2), theta=0.1).owner.tolist() == [0, 0, 1]
    uncapped = balance(load, owner, np.arange(2), theta=0.1, capped=False)
    assert uncapped.owner.tolist() == [0, 1, 1] and uncapped.detached == 1


def test_home_prefers_load_then_state_then_lowest_instance():
    problem = make_problem([2, 2, 0, 0], [1, 5, 3, 3], [0, 1, 0, 1], 2, key_group=[1, 1, 2, 2])
    groups = KeyGroups.of(problem)
    assert groups.home.tolist() == [1, 0]


def test_groups_above_the_detach_threshold_stay_and_the_note_says_why():
    # Mean 5, theta 0.1: groups of 3 are above theta * mean = 0.5, so instance 0 keeps 9.
    problem = grouped([[3, 3, 3], [1]], 2)
    result = plan(problem, theta=0.1)
    assert not result.moved.any()
    assert any("1 instance(s) stay above u" in n and "4 such groups" in n for n in result.notes)
