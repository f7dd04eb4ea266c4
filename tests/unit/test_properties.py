"""Properties every planner of the registry must have, on random small problems (hypothesis).

* every key is assigned exactly once, to an instance in [0, N);
* the reported metrics are the metrics recomputed from the assignment;
* a plan reported feasible has imbalance <= 1 + theta, and no key on a drained instance;
* the migration lower bound never exceeds the migration the plan achieved; with A_max it
  is the table-aware bound (for A_max or the plan's own table, the larger);
* the same input gives the same plan.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalance.core.bounds import cover_lower_bound, migration_lower_bound
from rebalance.core.model import PlanParams, Problem, evaluate
from rebalance.core.planners import METHODS, get_planner

# MILP-based planners cost a solver run per example: fewer examples, short time limit.
EXAMPLES = {"milp": 6, "auto": 10}
SLOW = {"milp", "auto"}


@st.composite
def problems(draw):
    n = draw(st.integers(1, 5))
    k = draw(st.integers(1, 24))
    windows = draw(st.integers(1, 3))
    int_loads = draw(st.booleans())
    if int_loads:
        series = draw(st.lists(st.lists(st.integers(0, 50), min_size=k, max_size=k),
                               min_size=windows, max_size=windows))
    else:
        series = draw(st.lists(st.lists(st.floats(0, 100, allow_nan=False), min_size=k,
                                        max_size=k), min_size=windows, max_size=windows))
    series = np.asarray(series, dtype=np.float64)
    state = np.asarray(draw(st.lists(st.integers(0, 1000), min_size=k, max_size=k)), float)
    # current may name removed instances (scale-in) up to n + 1
    current = np.asarray(draw(st.lists(st.integers(0, n), min_size=k, max_size=k)))
    if not draw(st.booleans()):
        current = np.minimum(current, n - 1)
    default = np.asarray(draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)))
    drain = frozenset()
    if n >= 2 and draw(st.integers(0, 4)) == 0:
        drain = frozenset({draw(st.integers(0, n - 1))})
    return Problem(keys=np.array([f"k{i}" for i in range(k)], dtype=object),
                   load=series.mean(axis=0), state=state, current=current, default=default,
                   n_instances=n, drain=drain, load_series=series)


@st.composite
def parameters(draw):
    theta = draw(st.sampled_from([0.01, 0.08, 0.3, 1.0]))
    max_table = draw(st.sampled_from([None, None, 0, 3, 10]))
    return PlanParams(theta=theta, max_table=max_table, time_limit=1.0)


def _check(method: str, problem: Problem, params: PlanParams) -> None:
    plan = get_planner(method).plan(problem, params)
    a = plan.assignment
    assert a.shape == (problem.n_keys,)
    assert a.dtype.kind == "i"
    assert ((a >= 0) & (a < problem.n_instances)).all()
    recomputed = evaluate(problem, a)
    assert plan.metrics == recomputed
    assert np.array_equal(plan.moved, a != problem.current)
    if plan.feasible:
        assert recomputed.imbalance_after <= (1 + params.theta) * (1 + 1e-9)
        assert not np.isin(a, list(problem.drain)).any()
        if params.max_table is not None:
            assert recomputed.table_size <= params.max_table
    assert plan.lower_bound_bytes <= recomputed.migration_bytes * (1 + 1e-9) + 1e-9
    # the bound for the plan's own maximum load holds too
    lb_own = migration_lower_bound(problem, max(recomputed.max_load_after,
                                                problem.max_load(params.theta)))
    assert lb_own <= recomputed.migration_bytes * (1 + 1e-9) + 1e-9
    # ... and so does the A_max-aware bound, for the plan's own load and table size
    if params.max_table is not None:
        lb_table = migration_lower_bound(
            problem, max(recomputed.max_load_after, problem.max_load(params.theta)),
            max(params.max_table, recomputed.table_size))
        assert lb_table <= recomputed.migration_bytes * (1 + 1e-9) + 1e-9
        # ... and it is the bound the plan reports (finish_plan), never below the plain one
        reported = lb_table
    else:
        reported = lb_own
    # auto and milp report the larger of that and the integer knapsack-cover bound
    if method in ("auto", "milp"):
        whole = cover_lower_bound(problem, max(recomputed.max_load_after,
                                               problem.max_load(params.theta)))
        assert whole is None or whole <= recomputed.migration_bytes * (1 + 1e-9) + 1e-9
        if whole is not None:
            reported = max(reported, whole)
    assert plan.lower_bound_bytes == pytest.approx(reported, rel=1e-9, abs=1e-9) \
        or plan.lower_bound_bytes == reported
    assert plan.lower_bound_bytes >= lb_own * (1 - 1e-9) - 1e-9 or lb_own == float("inf")
    if plan.feasible and plan.solver_bound is not None:
        assert plan.solver_bound <= recomputed.migration_bytes * (1 + 1e-9) + 1e-9
    if method not in SLOW:
        again = get_planner(method).plan(problem, params)
        assert np.array_equal(again.assignment, a)


@pytest.mark.parametrize("method", METHODS)
def test_planner_properties(method):
    @settings(max_examples=EXAMPLES.get(method, 40), deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(problem=problems(), params=parameters())
    def run(problem, params):
        _check(method, problem, params)

    run()


def test_registry_covers_auto():
    assert "auto" in METHODS
    assert get_planner("auto").name == "auto"


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problem=problems(), theta=st.sampled_from([0.0001, 0.08, 1.0]))
def test_lower_bound_is_below_every_planner_that_reaches_its_target(problem, theta):
    """A plan meeting max load <= L can never migrate less than the bound for L."""
    params = PlanParams(theta=theta)
    for method in ("mixed", "mintable", "greedy", "lpt", "elb"):
        plan = get_planner(method).plan(problem, params)
        reached = plan.metrics.max_load_after
        assert migration_lower_bound(problem, reached) <= plan.metrics.migration_bytes * (1 + 1e-9) + 1e-9


# ------------------------------------------------------------------ the auto planner
def _synthetic_problem(interval=1, n_keys=2000, n=8):
    from rebalance.core.synthetic import SyntheticConfig, SyntheticWorkload

    w = SyntheticWorkload(SyntheticConfig(n_keys=n_keys, n_instances=n, fluctuation=0.5))
    return w.problem(interval)


def test_auto_stops_at_the_cover_plan_when_it_reaches_the_integer_bound():
    problem = _synthetic_problem()
    params = PlanParams(theta=0.08, max_table=300, time_limit=3.0)
    mixed = get_planner("mixed").plan(problem, params)
    auto = get_planner("auto").plan(problem, params)
    assert auto.feasible and mixed.feasible
    assert auto.metrics.migration_bytes <= mixed.metrics.migration_bytes
    assert auto.metrics.table_size <= 300
    assert any(n.startswith("kept the cover plan: within 2%") for n in auto.notes)
    assert not any(n.startswith("milp polish") for n in auto.notes)
    assert auto.metrics.migration_bytes <= 1.02 * auto.lower_bound_bytes


def test_auto_polishes_with_the_milp_when_the_cover_plan_is_not_good_enough(monkeypatch):
    from rebalance.core.planners import auto as auto_module

    monkeypatch.setattr(auto_module, "GOOD_ENOUGH", -1.0)  # nothing is ever good enough
    problem = _synthetic_problem()
    params = PlanParams(theta=0.08, max_table=300, time_limit=3.0)
    auto = get_planner("auto").plan(problem, params)
    mixed = get_planner("mixed").plan(problem, params)
    assert auto.feasible
    assert auto.metrics.migration_bytes <= mixed.metrics.migration_bytes
    assert any(n.startswith("milp polish") for n in auto.notes)
    assert any(n.startswith("chose") for n in auto.notes)
    # the polish has a budget of its own, well inside the time limit
    (polish,) = [n for n in auto.notes if n.startswith("milp polish")]
    assert 0 < float(re.match(r"milp polish \(([0-9.]+) s", polish).group(1)) < params.time_limit


def test_auto_keeps_mixed_on_large_problems(monkeypatch):
    from rebalance.core.planners import auto as auto_module

    monkeypatch.setattr(auto_module, "MILP_MAX_KEYS", 100)
    problem = _synthetic_problem()
    params = PlanParams(theta=0.08)
    auto = get_planner("auto").plan(problem, params)
    mixed = get_planner("mixed").plan(problem, params)
    assert np.array_equal(auto.assignment, mixed.assignment)
    assert any("exceed the MILP polish limit" in n for n in auto.notes)


def test_auto_skips_the_polish_without_time():
    problem = _synthetic_problem()
    auto = get_planner("auto").plan(problem, PlanParams(theta=0.08, time_limit=0.01))
    assert any("time limit left" in n or "lower bound" in n for n in auto.notes)
    assert not any(n.startswith("milp polish") for n in auto.notes)


def test_fit_table_sends_keys_home_free_first_then_cheapest():
    from rebalance.core.planners.auto import fit_table

    # 3 instances; defaults all 0. k0: current 1 -> plan 2 (moves anyway: free to send home);
    # k1: current 0 -> plan 1 (plan moved it off home); k2, k3: table keys staying on 2,
    # k3 has less state.
    problem = Problem(keys=np.array(["k0", "k1", "k2", "k3", "k4"], dtype=object),
                      load=np.array([1.0, 1.0, 1.0, 1.0, 1.0]),
                      state=np.array([50.0, 50.0, 40.0, 10.0, 1.0]),
                      current=np.array([1, 0, 2, 2, 0]), default=np.array([0, 0, 0, 0, 0]),
                      n_instances=3)
    plan = np.array([2, 1, 2, 2, 0])
    params = PlanParams(theta=2.0, max_table=None)  # L_max = 3 * 5/3 = 5: room everywhere
    a, back = fit_table(problem, params, plan)
    assert back == 1 and a.tolist() == [0, 1, 2, 2, 0]  # only the free one without A_max
    a, back = fit_table(problem, PlanParams(theta=2.0, max_table=1), plan)
    # free k0, then undo k1's move, then the cheapest table key k3
    assert back == 3 and a.tolist() == [0, 0, 2, 0, 0]
    # L_max binds: the default instance may not exceed it
    tight = PlanParams(theta=0.0001, max_table=0)
    a, back = fit_table(problem, tight, plan)
    assert problem.instance_loads(a).max() <= problem.max_load(0.0001) * (1 + 1e-9) \
        or back == 0


def test_auto_is_deterministic():
    """Same input, same plan: the MILP polish stops at its gap, not at the deadline (a
    generous time limit here, so a loaded test machine does not reach the deadline)."""
    problem = _synthetic_problem(interval=2, n_keys=1000)
    params = PlanParams(theta=0.08, max_table=200, time_limit=300.0)
    a = get_planner("auto").plan(problem, params)
    b = get_planner("auto").plan(problem, params)
    assert not any("Time limit reached" in n for n in a.notes + b.notes)
    assert np.array_equal(a.assignment, b.assignment)
