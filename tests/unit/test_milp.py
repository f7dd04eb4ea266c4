"""MILP planner (seed 002, fixed): exact optima, limits, scaling, starts and bounds."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers_milp import brute_force, make_problem, overload, zipf_problem

from rebalance.core.model import PlanningError, PlanParams
from rebalance.core.planners import get_planner, milp
from rebalance.core.planners.milp import setting as milp_setting


def plan(problem, **params):
    return get_planner("milp").plan(problem, PlanParams(**{"time_limit": 5.0, **params}))


def random_problem(seed: int):
    """Six keys on 2-3 instances, sometimes with a removed or drained instance."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 4))
    drain = (int(rng.integers(0, n)),) if seed % 5 == 0 else ()
    return make_problem(rng.integers(1, 20, 6), rng.integers(0, 50, 6),
                        rng.integers(0, n + seed % 2, 6), n, drain)


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("budget", [None, "bytes", "keys"])
def test_plan_is_the_brute_force_optimum(seed, budget):
    problem = random_problem(seed)
    theta = (0.05, 0.2, 0.5)[seed % 3]
    forced = problem.must_move()
    budget_bytes = max(30.0, problem.state[forced].sum()) if budget == "bytes" else None
    budget_keys = max(2, int(forced.sum())) if budget == "keys" else None
    result = plan(problem, theta=theta, budget_bytes=budget_bytes, budget_keys=budget_keys)
    worst, total, migration = brute_force(problem, theta, budget_bytes, budget_keys)
    got_worst, got_total = overload(problem, result.assignment, theta)
    assert got_worst == pytest.approx(worst, abs=1e-9)
    assert got_total == pytest.approx(total, abs=1e-9)
    # The seed-002 distance breaks ties and may buy at most lambda * max(1, theta) of state.
    slack = milp_setting.DISTANCE_WEIGHT * max(1.0, theta) * problem.state.sum()
    assert result.metrics.migration_bytes == pytest.approx(migration, abs=slack + 1e-9)


def test_moves_the_cheapest_key_that_restores_the_bound():
    # Instance 0 holds 8 of 10 (mean 5, L_max 6): moving b (3, 5 bytes) is the cheapest fix.
    problem = make_problem([4, 3, 1, 2], [40, 5, 1, 1], [0, 0, 0, 1], 2)
    result = plan(problem, theta=0.2)
    assert result.assignment.tolist() == [0, 1, 0, 1]
    assert result.feasible and result.metrics.migration_bytes == 5
    assert any("hard bound: HiGHS 'Optimal'" in n for n in result.notes)
    slack = milp_setting.DISTANCE_WEIGHT * problem.state.sum()
    assert 5 - slack - 1e-9 <= result.solver_bound <= 5


def test_drained_instance_ends_empty_and_removed_keys_move():
    problem = make_problem([5, 4, 3, 3, 2, 2], [9, 8, 7, 6, 5, 4], [0, 1, 2, 2, 3, 0], 3,
                           drain=(2,))
    result = plan(problem, theta=0.1)
    assert not np.isin(result.assignment, [2]).any()
    assert result.moved[problem.must_move()].all()
    assert result.feasible
    assert result.metrics.migration_bytes == pytest.approx(brute_force(problem, 0.1)[2], abs=1e-3)


def test_scale_out_fills_the_new_instance():
    problem = make_problem([4, 4, 3, 3, 2, 2], [1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1], 3)
    result = plan(problem, theta=0.1)
    assert (result.assignment == 2).any()
    assert result.feasible and result.metrics.imbalance_after <= 1.1 + 1e-9
    assert result.metrics.migration_bytes == pytest.approx(brute_force(problem, 0.1)[2], abs=1e-3)


def test_budgets_are_respected_when_they_make_the_bound_unreachable():
    problem = zipf_problem(3000, 6, seed=1)
    need = plan(problem, theta=0.05, time_limit=2.0).metrics.migration_bytes
    by_bytes = plan(problem, theta=0.05, time_limit=2.0, budget_bytes=need / 3)
    assert by_bytes.metrics.migration_bytes <= need / 3 * (1 + 1e-9)
    assert by_bytes.metrics.imbalance_after < by_bytes.metrics.imbalance_before
    assert any("theta unreachable" in n for n in by_bytes.notes)
    assert by_bytes.solver_bound is None
    by_keys = plan(problem, theta=0.05, time_limit=2.0, budget_keys=3)
    assert by_keys.metrics.moved_keys <= 3
    assert by_keys.metrics.imbalance_after < by_keys.metrics.imbalance_before


def test_budget_below_the_forced_migration_is_raised_with_a_note():
    problem = make_problem([3, 3, 2, 2], [10, 10, 10, 10], [0, 1, 2, 2], 3, drain=(2,))
    result = plan(problem, theta=0.5, budget_bytes=5.0)
    assert not np.isin(result.assignment, [2]).any()
    assert result.metrics.migration_bytes == 20
    assert any("raised to that" in n for n in result.notes)


def test_giant_key_gets_an_instance_of_its_own_and_the_rest_meet_the_bound():
    # Key 0 alone is 2.4 x the mean: the bound is unreachable, the model may not be.
    problem = make_problem([12, 2, 2, 2, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 2, 2], 3)
    result = plan(problem, theta=0.1)
    giant = result.assignment[0]
    assert (result.assignment == giant).sum() == 1
    loads = problem.instance_loads(result.assignment)
    assert (np.delete(loads, giant) <= problem.max_load(0.1)).all()
    assert any("theta unreachable" in n and "'k0'" in n for n in result.notes)
    assert result.solver_bound is None


def test_warm_start_is_used_and_validated():
    problem = make_problem([4, 3, 1, 2], [40, 5, 1, 1], [0, 0, 0, 1], 2)
    result = plan(problem, theta=0.2, warm_start=[0, 1, 0, 1])
    assert result.assignment.tolist() == [0, 1, 0, 1]
    assert "start: params.warm_start" in result.notes
    assert any("MIP start: greedy repair of the start (max load 1.0000" in n
               for n in result.notes)
    with pytest.raises(PlanningError, match="shape"):
        plan(problem, warm_start=[0, 1])
    drained = make_problem([1, 1], [1, 1], [0, 1], 2, drain=(1,))
    with pytest.raises(PlanningError, match="active"):
        plan(drained, warm_start=[0, 1])


def test_falls_back_to_the_start_when_the_solver_finds_nothing(monkeypatch):
    problem = make_problem([5, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 2], 3, drain=(2,))
    nothing = milp_setting._Outcome("Time limit reached", False, False, np.inf, 0.0, np.inf, 0.1)
    monkeypatch.setattr(milp, "_solve", lambda *args: nothing)
    result = plan(problem, theta=0.1)
    # The current assignment, the drained instance's key on the least-loaded instance.
    assert result.assignment.tolist() == [0, 0, 1, 1]
    assert any(n.startswith("fallback") for n in result.notes)
    warm = plan(problem, theta=0.1, warm_start=[1, 0, 1, 0])
    assert warm.assignment.tolist() == [1, 0, 1, 0]


@pytest.mark.parametrize(("n_keys", "model"), [(60, "exact"), (3000, "reduced")])
def test_solver_bound_is_a_lower_bound_on_the_migration(n_keys, model):
    problem = zipf_problem(n_keys, 4, seed=2)
    result = plan(problem, theta=0.05, time_limit=3.0)
    assert result.feasible, result.notes
    assert any(n.startswith(f"model: {model}") for n in result.notes)
    assert 0 < result.solver_bound <= result.metrics.migration_bytes


def test_reduced_model_moves_light_keys_and_meets_the_bound():
    problem = zipf_problem(5000, 8, seed=3)
    result = plan(problem, theta=0.05, time_limit=3.0, milp_max_keys=10)
    heaviest = np.argsort(-problem.load)[:10]
    light_moved = np.setdiff1d(np.flatnonzero(result.moved), heaviest)
    assert result.feasible, result.notes
    assert len(light_moved) > 0
    assert result.metrics.migration_bytes <= 1.2 * result.solver_bound


def test_time_limit_is_respected(monkeypatch):
    # HiGHS is given what is left of the time limit (never more), and what it found by
    # then is a plan. (How long the whole planner takes is a benchmark figure.)
    from rebalance.core.planners.milp import solve

    limits = []
    original = solve._HighsWithStart.callSolver

    def record(self, lp):  # the time limit callSolver hands HiGHS (its deadline - now)
        limits.append(max(solve.MIN_SOLVE_SECONDS, self._deadline - time.perf_counter()))
        return original(self, lp)

    monkeypatch.setattr(solve._HighsWithStart, "callSolver", record)
    problem = zipf_problem(20000, 12, seed=4)
    result = plan(problem, theta=0.02, time_limit=1.0)
    assert limits and all(limit < 1.0 for limit in limits), limits
    assert result.metrics.imbalance_after < result.metrics.imbalance_before


def test_same_input_gives_the_same_plan():
    problem = zipf_problem(2000, 5, seed=5)
    first, second = plan(problem, theta=0.05), plan(problem, theta=0.05)
    assert np.array_equal(first.assignment, second.assignment)


def test_no_load_keeps_the_current_assignment():
    problem = make_problem([0, 0, 0], [5, 5, 5], [0, 0, 1], 2)
    result = plan(problem)
    assert not result.moved.any()
    assert any("no load" in n for n in result.notes)


# ------------------------------------------------------------ routing-table bound (A_max)

def table_problem(seed: int):
    """Seven keys on 3 instances, some now off their default instance (a routing table)."""
    from rebalance.core.model import Problem

    rng = np.random.default_rng(100 + seed)
    n, k = 3, 7
    current = rng.integers(0, n, k)
    default = np.where(rng.random(k) < 0.4, rng.integers(0, n, k), current)
    return Problem(keys=np.array([f"k{i}" for i in range(k)], dtype=object),
                   load=rng.integers(1, 20, k).astype(float),
                   state=rng.integers(1, 50, k).astype(float), current=current,
                   default=default, n_instances=n)


def brute_force_with_table(problem, theta: float, max_table: int) -> float:
    """Least migration over all assignments meeting L_max and the table bound (inf: none)."""
    from helpers_milp import all_assignments

    rows = all_assignments(problem)
    loads = np.stack([np.bincount(r, weights=problem.load, minlength=problem.n_instances)
                      for r in rows])
    ok = loads.max(axis=1) <= problem.max_load(theta) * (1 + 1e-9)
    ok &= (rows != problem.default).sum(axis=1) <= max_table
    migration = (rows != problem.current).astype(float) @ problem.state
    return float(migration[ok].min()) if ok.any() else float("inf")


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("max_table", [0, 1, 3])
def test_table_bound_gives_the_brute_force_optimum(seed, max_table):
    problem = table_problem(seed)
    theta = 0.3
    best = brute_force_with_table(problem, theta, max_table)
    result = plan(problem, theta=theta, max_table=max_table)
    if not np.isfinite(best):
        # no plan meets both bounds: the planner says so, with the bound it broke
        assert not result.feasible
        assert any(f"exceeds max table {max_table}" in n for n in result.notes), result.notes
        return
    assert result.feasible, result.notes
    assert result.metrics.table_size <= max_table
    slack = milp_setting.DISTANCE_WEIGHT * max(1.0, theta) * problem.state.sum()
    assert result.metrics.migration_bytes == pytest.approx(best, abs=slack + 1e-9)
    # The exact model's solver bound holds for every plan meeting L_max AND A_max.
    assert result.solver_bound is not None
    assert result.solver_bound <= best * (1 + 1e-9) + 1e-9


def test_reduced_model_honours_the_table_bound_and_sends_light_table_keys_home():
    from rebalance.core.synthetic import SyntheticConfig, SyntheticWorkload

    w = SyntheticWorkload(SyntheticConfig(n_keys=4000, n_instances=8, fluctuation=1.0))
    free = plan(w.problem(0), theta=0.08, time_limit=3.0)
    assert free.metrics.table_size > 150
    problem = w.problem(1, free.assignment)          # now a table of free's size
    limit = free.metrics.table_size - 100             # must shrink it while rebalancing
    result = plan(problem, theta=0.08, max_table=limit, time_limit=3.0)
    assert any("table keys that may go home" in n for n in result.notes)
    assert result.feasible, result.notes
    assert result.metrics.table_size <= limit
    assert result.solver_bound is None               # reduced + A_max: no bound claimed


def test_planner_options_are_typed_checked_and_json_able():
    """Planner options are PlanParams fields (no untyped dict): bad values are refused by
    name, and ``to_dict`` leaves out the warm start array so a plan's params stay JSON."""
    import json

    params = PlanParams(warm_start=np.array([0, 1]), highs_options={"mip_rel_gap": 0.01},
                        milp_max_keys=3, llfd_resolution_bits=None)
    out = params.to_dict()
    assert "warm_start" not in out and out["milp_max_keys"] == 3
    json.dumps(out)
    for bad, name in ((dict(llfd_resolution_bits=0), "llfd_resolution_bits"),
                      (dict(llfd_resolution_bits="fast"), "llfd_resolution_bits"),
                      (dict(milp_max_keys=-1), "milp_max_keys"),
                      (dict(milp_max_returns=2.5), "milp_max_returns"),
                      (dict(clb_threshold=1.0), "clb_threshold")):
        with pytest.raises(PlanningError, match=name):
            PlanParams(**bad)
