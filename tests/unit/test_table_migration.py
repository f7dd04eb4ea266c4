"""Seed 003 planners: LLFD engine, MinTable, MinMig, Mixed, compact representation."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_table_migration import D1, D2, random_problem, reference_llfd, table_of, worked_example

from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners import get_planner
from rebalance.core.planners.compact import CompactKeys, Psi, value_levels
from rebalance.core.planners.table_migration import packing_bound, run_llfd

TINY = PlanParams(theta=1e-9)


# ---------------------------------------------------------------- worked example (Fig. 4)


def test_llfd_worked_example_after_moving_k1_out_of_d1():
    problem = worked_example()
    k1 = problem.keys == "k1"
    ck = CompactKeys.build(problem, Psi.LOAD, 1.5, None, 10.0, candidates=k1)
    out = run_llfd(ck, problem, n_clean=0, bound=10.0)
    assert problem.instance_loads(out.assignment).tolist() == [10, 10]
    assert table_of(problem, out.assignment) == {"k1": D2, "k3": D2, "k4": D1, "k5": D1}
    assert out.adjusted == 2 and out.fallbacks == 0  # E = {k3}, then E = {k4}


def test_mintable_worked_example():
    problem = worked_example()
    plan = get_planner("mintable").plan(problem, TINY)
    assert problem.instance_loads(plan.assignment).tolist() == [10, 10]
    assert table_of(problem, plan.assignment) == {"k2": D2, "k4": D1}
    assert plan.feasible
    assert any("MinTable" in note for note in plan.notes)


def test_acceptance_uses_less_or_equal():
    # d2 at 9 takes a key of 1 exactly up to L_max = 10 (the printed '<' would refuse it).
    problem = Problem(keys=np.array(["a", "b", "c"], dtype=object), load=[10, 1, 9],
                      state=[1, 1, 1], current=[0, 0, 1], default=[0, 0, 1], n_instances=2)
    ck = CompactKeys.build(problem, Psi.LOAD, 1.5, None, 10.0,
                           candidates=problem.keys == "b")
    out = run_llfd(ck, problem, 0, 10.0)
    assert out.assignment.tolist() == [0, 1, 1]
    assert out.adjusted == 0 and out.fallbacks == 0


# ----------------------------------------------------- engine = key-by-key Algorithm 1


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("psi", [Psi.LOAD, Psi.GAMMA])
@pytest.mark.parametrize(("n_keys", "theta"), [(40, 0.05), (25, 0.005)])  # 2nd: fallbacks
def test_engine_matches_key_by_key_reference(seed, psi, n_keys, theta):
    """With distinct loads every record is one key: the engine is Algorithm 1 exactly."""
    problem = random_problem(seed, n_keys=n_keys, drain=(1,) if seed % 3 == 0 else (),
                             removed=seed % 2)
    beta = 1.5
    bound, _ = packing_bound(problem, theta)
    ck = CompactKeys.build(problem, psi, beta, None, problem.max_load(theta))
    psi_value = problem.load if psi is Psi.LOAD else problem.load ** beta / problem.state
    for n_clean in sorted({0, ck.n_cleanable // 2, ck.n_cleanable}):
        out = run_llfd(ck, problem, n_clean, bound)
        expected = reference_llfd(problem, psi_value, n_clean, bound, problem.max_load(theta))
        np.testing.assert_array_equal(out.assignment, expected)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("bits", [0, 1, 3])
def test_compact_levels_keep_loads_exact(seed, bits):
    """Discretisation only coarsens the order: LLFD's bound holds on the exact loads."""
    problem = random_problem(seed, n_keys=300, n_instances=6, table=0.5)
    bound, _ = packing_bound(problem, 0.1)
    ck = CompactKeys.build(problem, Psi.GAMMA, 1.5, bits, bound)
    assert ck.n_records < problem.n_keys
    out = run_llfd(ck, problem, ck.n_cleanable // 3, bound)
    if out.fallbacks == 0:
        assert problem.instance_loads(out.assignment).max() <= bound * (1 + 1e-9)


# -------------------------------------------------------------------- levels


def test_value_levels_exact_and_compact():
    values = np.array([0.0, -0.0, 1, 2, 3, 7, 15, 16, 17, 18, 0.5, 1e-300, 1e300])
    exact = value_levels(values, None)
    assert len(np.unique(exact)) == len(np.unique(values))
    compact = value_levels(values, 3)
    order = np.argsort(values, kind="stable")
    assert (np.diff(compact[order]) >= 0).all()          # monotone
    assert compact[0] == compact[1] == 0                 # -0.0 is 0.0
    small = values[2:7]                                  # integers below 2R = 16: exact
    assert len(np.unique(value_levels(small, 3))) == len(small)
    assert compact[7] == compact[8] != compact[9]        # 16, 17 share [16, 18)


def test_value_levels_relative_width():
    values = np.geomspace(1e-3, 1e6, 5000)
    levels = value_levels(values, 3)
    for level in np.unique(levels):
        group = values[levels == level]
        assert group.max() / group.min() < 1 + 1 / 8


# -------------------------------------------------------------------- heuristics


def big_table_problem(seed: int = 3) -> Problem:
    return random_problem(seed, n_keys=400, n_instances=8, table=0.4)


def test_mintable_cleans_everything_and_minmig_nothing():
    problem = big_table_problem()
    params = PlanParams(theta=0.05)
    mintable = get_planner("mintable").plan(problem, params)
    minmig = get_planner("minmig").plan(problem, params)
    assert mintable.feasible and minmig.feasible
    assert mintable.metrics.table_size < minmig.metrics.table_size
    assert minmig.metrics.migration_bytes < mintable.metrics.migration_bytes


@pytest.mark.parametrize("a_max", [0, 20, 60, 100, 140])
def test_mixed_respects_table_bound(a_max):
    problem = big_table_problem()
    params = PlanParams(theta=0.05, max_table=a_max)
    mixed = get_planner("mixed").plan(problem, params)
    mintable = get_planner("mintable").plan(problem, params)
    if mintable.metrics.table_size <= a_max:
        assert mixed.metrics.table_size <= a_max
        assert mixed.feasible
    else:
        assert mixed.metrics.table_size <= get_planner("minmig").plan(
            problem, params).metrics.table_size
    assert any("Mixed" in note for note in mixed.notes)


def test_mixed_grows_n_monotonically_and_stops_when_the_table_fits():
    problem = big_table_problem()
    unbounded = get_planner("minmig").plan(problem, PlanParams(theta=0.05))
    a_max = unbounded.metrics.table_size - 25
    plan = get_planner("mixed").plan(problem, PlanParams(theta=0.05, max_table=a_max))
    assert plan.metrics.table_size <= a_max
    trials = [int(part.split(" sent back")[0]) for part in
              plan.notes[0].split("table entries per attempt: ")[1].split(", ")]
    assert trials[0] == 0 and trials == sorted(set(trials))


def test_mixed_without_table_bound_is_minmig():
    problem = big_table_problem()
    params = PlanParams(theta=0.05)
    mixed = get_planner("mixed").plan(problem, params)
    minmig = get_planner("minmig").plan(problem, params)
    np.testing.assert_array_equal(mixed.assignment, minmig.assignment)


def test_mixed_falls_back_to_mintable_when_a_max_is_unreachable():
    problem = big_table_problem()
    plan = get_planner("mixed").plan(problem, PlanParams(theta=0.05, max_table=0))
    mintable = get_planner("mintable").plan(problem, PlanParams(theta=0.05, max_table=0))
    assert plan.metrics.table_size == mintable.metrics.table_size
    assert not plan.feasible
    assert any("even with all" in note and "routed key(s) sent back" in note for note in plan.notes)


def test_gamma_treats_stateless_keys_as_free_to_move():
    # d0 is over by 3; the stateless key of load 3 goes, not the stateful key of load 4.
    problem = Problem(keys=np.array(["s", "free", "x", "y"], dtype=object),
                      load=[4, 3, 6, 7], state=[5, 0, 50, 50],
                      current=[0, 0, 0, 1], default=[0, 0, 0, 1], n_instances=2)
    plan = get_planner("minmig").plan(problem, PlanParams(theta=0.01))
    assert plan.moved.tolist() == [False, True, False, False]
    assert plan.metrics.migration_bytes == 0


# ------------------------------------------------------------ drain, scale, heavy keys


@pytest.mark.parametrize("method", ["mintable", "minmig", "mixed"])
def test_drain_and_scale_in(method):
    problem = random_problem(7, n_keys=200, n_instances=5, drain=(2,), removed=2)
    assert problem.must_move().any()
    plan = get_planner(method).plan(problem, PlanParams(theta=0.1, max_table=150))
    assert not (plan.assignment == 2).any()
    assert (plan.assignment < 5).all()
    assert plan.moved[problem.must_move()].all()
    assert plan.metrics.imbalance_after <= 1.1 + 1e-9


@pytest.mark.parametrize("method", ["mintable", "minmig", "mixed"])
def test_scale_out_fills_new_instance(method):
    rng = np.random.default_rng(1)
    k = 300
    current = rng.integers(0, 4, k)
    problem = Problem(keys=np.array([f"k{i}" for i in range(k)], dtype=object),
                      load=rng.random(k) + 0.5, state=rng.random(k) + 1, current=current,
                      default=rng.integers(0, 5, k), n_instances=5)
    plan = get_planner(method).plan(problem, PlanParams(theta=0.05))
    assert plan.feasible
    assert problem.instance_loads(plan.assignment)[4] > 0


def test_zero_load_keys_that_must_move_go_to_their_default():
    problem = Problem(keys=np.array(["a", "b", "c", "d"], dtype=object), load=[0, 0, 5, 5],
                      state=[9, 9, 1, 1], current=[2, 2, 0, 1], default=[1, 0, 0, 1],
                      n_instances=2)
    plan = get_planner("minmig").plan(problem, PlanParams(theta=0.05))
    assert plan.assignment.tolist() == [1, 0, 0, 1]


def test_key_heavier_than_l_max_stays_and_its_instance_sheds_the_rest():
    rng = np.random.default_rng(5)
    load = np.r_[100.0, rng.random(60) + 1]
    current = np.r_[0, rng.integers(0, 4, 60)]
    problem = Problem(keys=np.array([f"k{i}" for i in range(61)], dtype=object), load=load,
                      state=load, current=current, default=current, n_instances=4)
    plan = get_planner("minmig").plan(problem, PlanParams(theta=0.05))
    assert plan.assignment[0] == 0
    assert (plan.assignment[1:] != 0).all()
    assert plan.metrics.max_load_after == 100.0
    assert any("unreachable" in note for note in plan.notes)


# -------------------------------------------------------------------- determinism


@pytest.mark.parametrize("method", ["mintable", "minmig", "mixed"])
def test_deterministic(method):
    problem = random_problem(11, n_keys=500, n_instances=7, table=0.3, drain=(3,))
    params = PlanParams(theta=0.03, max_table=120)
    first = get_planner(method).plan(problem, params)
    second = get_planner(method).plan(problem, params)
    np.testing.assert_array_equal(first.assignment, second.assignment)
    assert first.notes == second.notes


def test_compact_mode_is_used_and_deterministic_on_many_keys():
    rng = np.random.default_rng(2)
    k, n = 80_000, 16
    load = rng.zipf(1.6, k).astype(float)
    default = rng.integers(0, n, k)
    current = default.copy()
    moved = rng.choice(k, 500, replace=False)
    current[moved] = (current[moved] + 1) % n
    problem = Problem(keys=np.arange(k).astype(str).astype(object), load=load,
                      state=load * 10 + rng.integers(0, 5, k), current=current, default=default,
                      n_instances=n)
    params = PlanParams(theta=0.05, max_table=800)
    first = get_planner("mixed").plan(problem, params)
    second = get_planner("mixed").plan(problem, params)
    np.testing.assert_array_equal(first.assignment, second.assignment)
    assert any("steps per power-of-two octave" in note for note in first.notes)
    bound, _ = packing_bound(problem, params.theta)
    if not any("least-loaded instance" in note for note in first.notes):
        assert first.metrics.max_load_after <= bound * (1 + 1e-9)
