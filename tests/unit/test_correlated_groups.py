"""CLB planner (seed 001, Algorithm 2, fixed): correlation split, balancing, mapping."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers_milp import make_problem

from rebalance.core.model import PlanningError, PlanParams
from rebalance.core.planners import get_planner
from rebalance.core.planners.correlated_groups import (
    correlation,
    correlation_split,
    map_sets_to_instances,
    min_cost_assignment,
)
from rebalance.core.planners.eager_groups import KeyGroups


def plan(problem, theta=0.1, **options):
    return get_planner("clb").plan(problem, PlanParams(theta=theta, **options))


def twin_series(n_patterns: int, windows: int = 12, seed: int = 0) -> np.ndarray:
    """Two identical columns (twins) per random pattern: W x 2 * n_patterns."""
    rng = np.random.default_rng(seed)
    patterns = rng.random((windows, n_patterns)) + 1.0
    return np.repeat(patterns, 2, axis=1)


def grouped_problem(n_groups=30, keys_per_group=4, n_instances=3, windows=8, seed=0, drain=()):
    """Keys of a group together on one current instance, with a per-window load series."""
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(n_groups), keys_per_group)
    load = rng.pareto(1.5, len(group)) + 0.1
    series = load * rng.uniform(0.5, 1.5, (windows, len(group)))
    home = rng.integers(0, n_instances, n_groups)
    return make_problem(series.mean(axis=0), load * 10, home[group], n_instances, drain,
                        load_series=series, key_group=group)


def test_correlation_is_pearson_and_zero_for_constant_columns():
    series = np.array([[1.0, 2.0, 5.0, 3.0], [2.0, 4.0, 5.0, 1.0], [3.0, 6.0, 5.0, 2.0]])
    corr = correlation(series)
    assert corr[0, 1] == pytest.approx(1.0, abs=1e-6)
    assert corr[0, 3] == pytest.approx(np.corrcoef(series[:, 0], series[:, 3])[0, 1], abs=1e-6)
    assert (corr[2] == 0).all()


def test_split_separates_every_correlated_twin_pair():
    # Each split's pivot sends its twin to a new set; the three pivots stay together.
    corr = correlation(twin_series(3))
    labels, splits = correlation_split(corr, np.ones(6), n_sets=4, threshold=0.9)
    assert (labels[0::2] != labels[1::2]).all()
    assert sorted(np.bincount(labels).tolist()) == [1, 1, 1, 3]
    assert (splits.by_correlation, splits.by_load) == (3, 0)


def test_split_by_load_when_no_pair_passes_the_threshold():
    corr = np.eye(5)
    labels, splits = correlation_split(corr, np.array([5.0, 4, 3, 2, 1]), 3, threshold=0.5)
    assert sorted(np.bincount(labels).tolist()) == [1, 2, 2]
    assert (splits.by_correlation, splits.by_load) == (0, 2)
    single, _ = correlation_split(np.eye(2), np.ones(2), 4, threshold=0.5)
    assert sorted(single.tolist()) == [0, 1]  # stops when every set is a single unit


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_hungarian_matches_brute_force(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        cost = rng.integers(0, 9, (n, n)).astype(float)
        column = min_cost_assignment(cost)
        best = min(cost[np.arange(n), list(p)].sum() for p in itertools.permutations(range(n)))
        assert sorted(column.tolist()) == list(range(n))
        assert cost[np.arange(n), column].sum() == best


def test_mapping_follows_the_state_not_the_set_number():
    problem = grouped_problem()
    groups = KeyGroups.of(problem)
    units = np.arange(len(groups.ids))
    reversed_sets = 2 - groups.home          # set s holds exactly the groups of instance 2 - s
    instance, kept = map_sets_to_instances(problem, groups, units, reversed_sets, np.arange(3))
    assert instance.tolist() == [2, 1, 0] and kept == pytest.approx(1.0)
    naive_kept = problem.state[problem.current == 1].sum() / problem.state.sum()  # s -> s
    assert naive_kept < 0.5


def test_plan_keeps_groups_whole_balances_and_maps_with_least_migration():
    problem = grouped_problem(seed=3)
    result = plan(problem, theta=0.1)
    groups = problem.key_group
    for g in np.unique(groups):
        assert len(np.unique(result.assignment[groups == g])) == 1
    assert result.metrics.imbalance_after <= 1.1 + 1e-9
    # Any other set -> instance mapping (a relabelling of the instances) moves more state.
    for perm in itertools.permutations(range(3)):
        relabelled = np.array(perm)[result.assignment]
        moved = problem.state[relabelled != problem.current].sum()
        assert moved >= result.metrics.migration_bytes - 1e-9
    assert any("Hungarian" in n for n in result.notes)


def test_drained_instance_is_emptied():
    problem = grouped_problem(n_instances=4, drain=(1,), seed=4)
    result = plan(problem)
    assert not np.isin(result.assignment, [1]).any()


@pytest.mark.parametrize("series", [None, "one window"])
def test_without_two_windows_falls_back_to_elb(series):
    base = grouped_problem(seed=5)
    problem = make_problem(base.load, base.state, base.current, 3,
                           load_series=None if series is None else base.load[None, :],
                           key_group=base.key_group)
    result = plan(problem)
    elb = get_planner("elb").plan(problem, PlanParams(theta=0.1))
    assert np.array_equal(result.assignment, elb.assignment)
    assert result.notes[0].startswith("fallback to ELB")


def test_threshold_must_be_a_correlation():
    with pytest.raises(PlanningError, match="clb_threshold"):
        plan(grouped_problem(), clb_threshold=1.5)
