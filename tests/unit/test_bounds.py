"""The migration lower bound: the partial-sort version equals the former full-sort one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from rebalance.core.bounds import cover_lower_bound, migration_lower_bound
from rebalance.core.model import Problem


def _reference_bound(problem: Problem, max_load: float) -> float:
    """The former implementation: one lexsort of all keys by (instance, state per load)."""
    if problem.n_keys == 0:
        return 0.0
    if float(problem.load.max()) > max_load * (1 + 1e-12):
        return float("inf")
    forced = problem.must_move()
    bound = float(problem.state[forced].sum())
    stay = ~forced
    cur, load, state = problem.current[stay], problem.load[stay], problem.state[stay]
    loads = np.bincount(cur, weights=load, minlength=problem.n_instances)
    over = np.flatnonzero(loads > max_load * (1 + 1e-12))
    if len(over) == 0:
        return bound
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(load > 0, state / np.where(load > 0, load, 1.0), np.inf)
    order = np.lexsort((ratio, cur))
    cur_s, load_s, state_s = cur[order], load[order], state[order]
    starts = np.searchsorted(cur_s, over, side="left")
    ends = np.searchsorted(cur_s, over, side="right")
    for d, lo, hi in zip(over, starts, ends):
        excess = loads[d] - max_load
        cum = np.cumsum(load_s[lo:hi])
        j = int(np.searchsorted(cum, excess, side="left"))
        full = float(state_s[lo:lo + j].sum())
        shed_before = float(cum[j - 1]) if j > 0 else 0.0
        rest = excess - shed_before
        if j < hi - lo and load_s[lo + j] > 0:
            full += float(state_s[lo + j]) * min(1.0, rest / float(load_s[lo + j]))
        bound += full
    return bound


def _random_problem(rng: np.random.Generator, k: int, n: int) -> Problem:
    load = rng.pareto(1.2, k) * rng.integers(0, 2, k)          # many zero loads
    state = np.round(rng.lognormal(5, 2, k)) * rng.integers(0, 2, k) if rng.random() < 0.5 \
        else rng.lognormal(5, 2, k)
    if rng.random() < 0.3:
        state = np.round(load * 7)                              # many equal ratios
    current = rng.integers(0, n + (1 if rng.random() < 0.3 else 0), k)
    drain = frozenset({int(rng.integers(0, n))}) if n > 1 and rng.random() < 0.2 else frozenset()
    return Problem(keys=np.array([f"k{i}" for i in range(k)], dtype=object), load=load,
                   state=state, current=current, default=rng.integers(0, n, k), n_instances=n,
                   drain=drain)


@pytest.mark.parametrize("seed", range(40))
def test_partial_sort_bound_equals_the_full_sort_bound(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 5, 50, 300, 3000, 20000]))
    n = int(rng.integers(1, 12))
    problem = _random_problem(rng, k, n)
    mean = problem.mean_load() if problem.load.sum() > 0 else 1.0
    for theta in (0.0, 0.02, 0.3, 2.0):
        target = max((1 + theta) * mean, float(problem.load.max()))
        new, old = migration_lower_bound(problem, target), _reference_bound(problem, target)
        assert new == pytest.approx(old, rel=1e-9, abs=1e-6)


def test_subnormal_loads_give_no_overflow_warning_and_a_valid_bound():
    tiny = 5e-324
    problem = Problem(keys=np.array(["a", "b", "c", "d"], dtype=object),
                      load=np.array([tiny, 1.0, 1.0, 0.0]), state=np.array([1e300, 2.0, 3.0, 9.0]),
                      current=np.array([0, 0, 0, 1]), default=np.array([0, 0, 0, 1]),
                      n_instances=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bound = migration_lower_bound(problem, 1.0)
    assert bound == pytest.approx(2.0)  # shed the cheapest unit key, never the huge-ratio one


def _small_problem(rng, seed: int, max_keys: int, pareto_loads: bool = False) -> Problem:
    """A random problem small enough to enumerate: 2-3 instances, 2..max_keys-1 keys,
    keys on a removed instance (seed % 4 == 0) and a drained instance (seed % 7 == 0)."""
    n, k = int(rng.integers(2, 4)), int(rng.integers(2, max_keys))
    current = rng.integers(0, n + (1 if seed % 4 == 0 else 0), k)
    default = np.where(rng.random(k) < 0.5, rng.integers(0, n, k), np.minimum(current, n - 1))
    drain = frozenset({int(rng.integers(0, n))}) if seed % 7 == 0 else frozenset()
    load = rng.pareto(1.0, k) + 0.01 if pareto_loads else rng.integers(0, 20, k).astype(float)
    if load.sum() == 0:
        load[0] = 1.0   # a problem with some load: the bounds have something to bound
    return Problem(keys=np.array([f"k{i}" for i in range(k)], dtype=object), load=load,
                   state=rng.integers(0, 60, k).astype(float), current=current,
                   default=default, n_instances=n, drain=drain)


def _every_assignment(problem: Problem):
    """Instance loads, migration and table size of every assignment to active instances."""
    import itertools

    rows = np.array(list(itertools.product(np.flatnonzero(problem.active),
                                           repeat=problem.n_keys)))
    loads = np.stack([np.bincount(r, weights=problem.load, minlength=problem.n_instances)
                      for r in rows])
    migration = (rows != problem.current).astype(float) @ problem.state
    table = (rows != problem.default).sum(axis=1)
    return loads, migration, table


@pytest.mark.parametrize("seed", range(60))
def test_table_bound_is_valid_and_at_least_the_plain_bound(seed):
    """Brute force: the A_max-aware bound never exceeds the least migration of any plan
    meeting both the load bound and the table bound, and never falls below the plain one."""
    problem = _small_problem(np.random.default_rng(1000 + seed), seed, max_keys=8)
    loads, migration, table = _every_assignment(problem)
    compared = 0
    for theta in (0.0, 0.2, 1.0):
        target = max((1 + theta) * problem.mean_load(), float(problem.load.max()))
        plain = migration_lower_bound(problem, target)
        for max_table in range(0, problem.n_keys + 1):
            ok = (loads.max(axis=1) <= target * (1 + 1e-9)) & (table <= max_table)
            bound = migration_lower_bound(problem, target, max_table)
            assert bound >= plain - 1e-9
            if ok.any():
                assert bound <= migration[ok].min() * (1 + 1e-9) + 1e-9
                compared += 1
    assert compared, "no plan met the bounds: the bound was never checked against one"


def test_table_bound_charges_the_table_keys_that_must_go_home():
    # Instance 0 holds home keys a (load 4, state 1) and b (load 4, state 1); L = 6 means
    # 2 load must leave 0, adding a table entry. The table {c} is full (A_max = 1), so c
    # (state 10, the only table key) must go home too: a plan moves 1 + 10 = 11. The
    # relaxation may move half of a (0.5) and then needs half of c to go home (5).
    problem = Problem(keys=np.array(["a", "b", "c"], dtype=object),
                      load=np.array([4.0, 4.0, 1.0]), state=np.array([1.0, 1.0, 10.0]),
                      current=np.array([0, 0, 1]), default=np.array([0, 0, 0]), n_instances=2)
    assert migration_lower_bound(problem, 6.0) == pytest.approx(0.5)
    assert migration_lower_bound(problem, 6.0, max_table=1) == pytest.approx(5.5, rel=1e-6)
    assert migration_lower_bound(problem, 6.0, max_table=2) == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(40))
def test_finish_plan_skips_the_table_search_only_when_it_cannot_bind(seed):
    """``finish_plan`` reports the table-aware bound; its shortcut (the plain bound when
    the plain LP solution already fits the table) gives the same value as the search."""
    from rebalance.core.bounds import table_cannot_bind
    from rebalance.core.model import PlanParams
    from rebalance.core.planners import get_planner

    rng = np.random.default_rng(2000 + seed)
    n, k = int(rng.integers(2, 6)), int(rng.integers(5, 60))
    current = rng.integers(0, n, k)
    default = np.where(rng.random(k) < 0.7, current, rng.integers(0, n, k))
    problem = Problem(keys=np.array([f"k{i}" for i in range(k)], dtype=object),
                      load=rng.integers(0, 30, k).astype(float),
                      state=rng.integers(0, 100, k).astype(float), current=current,
                      default=default, n_instances=n)
    for theta in (0.05, 0.3):
        target = max(problem.max_load(theta), float(problem.load.max()))
        plain = migration_lower_bound(problem, target)
        for max_table in (0, 2, 5, k // 2, k):
            full = migration_lower_bound(problem, target, max_table)
            if table_cannot_bind(problem, target, max_table):
                assert full == pytest.approx(plain, rel=1e-9, abs=1e-9)
            params = PlanParams(theta=theta, max_table=max_table)
            plan = get_planner("mixed").plan(problem, params)
            m = plan.metrics
            own = migration_lower_bound(
                problem, max(problem.max_load(theta), m.max_load_after),
                max(max_table, m.table_size))
            assert plan.lower_bound_bytes == pytest.approx(own, rel=1e-9, abs=1e-9)
            assert plan.lower_bound_bytes <= m.migration_bytes * (1 + 1e-9) + 1e-9


def test_plans_report_the_table_aware_bound():
    # test_table_bound_charges_the_table_keys_that_must_go_home's problem: the plain bound
    # is 0.5, the table-aware one 5.5 with A_max = 1.
    from rebalance.core.model import PlanParams
    from rebalance.core.planners import get_planner

    problem = Problem(keys=np.array(["a", "b", "c"], dtype=object),
                      load=np.array([4.0, 4.0, 1.0]), state=np.array([1.0, 1.0, 10.0]),
                      current=np.array([0, 0, 1]), default=np.array([0, 0, 0]), n_instances=2)
    theta = 6.0 / problem.mean_load() - 1  # L_max = 6
    plan = get_planner("mixed").plan(problem, PlanParams(theta=theta, max_table=1))
    assert plan.metrics.max_load_after <= 6.0 and plan.metrics.table_size <= 1
    assert plan.lower_bound_bytes == pytest.approx(5.5, rel=1e-6)  # plain: 0.5
    assert plan.metrics.migration_bytes == pytest.approx(11.0)
    free = get_planner("mixed").plan(problem, PlanParams(theta=theta))
    assert free.lower_bound_bytes == pytest.approx(
        migration_lower_bound(problem, max(6.0, free.metrics.max_load_after)))


@pytest.mark.parametrize("seed", range(60))
def test_cover_bound_is_valid_and_at_least_the_plain_bound(seed):
    """Brute force over every assignment: the integer knapsack-cover bound never exceeds
    the least migration of a plan meeting the load bound (with or without a table bound,
    which it ignores), and it is never below the fractional (combinatorial) bound."""
    problem = _small_problem(np.random.default_rng(3000 + seed), seed, max_keys=9,
                             pareto_loads=seed % 2 == 0)
    loads, migration, table = _every_assignment(problem)
    compared = 0
    for theta in (0.0, 0.1, 0.3, 1.0):
        target = max((1 + theta) * problem.mean_load(), float(problem.load.max()))
        plain = migration_lower_bound(problem, target)
        whole = cover_lower_bound(problem, target)
        assert whole is not None and whole >= plain * (1 - 1e-9) - 1e-9
        ok = loads.max(axis=1) <= target * (1 + 1e-9)
        if ok.any():
            assert whole <= migration[ok].min() * (1 + 1e-9) + 1e-9
            compared += 1
        for max_table in range(0, problem.n_keys + 1):
            ok_t = ok & (table <= max_table)
            if ok_t.any():
                best = migration[ok_t].min() * (1 + 1e-9) + 1e-9
                assert whole <= best
                assert max(whole, migration_lower_bound(problem, target, max_table)) <= best
    assert compared, "no plan met the load bound: the bound was never checked against one"


def test_cover_bound_counts_whole_keys():
    # Instance 0 must shed 3 load; its keys: a (load 2, state 2), b (load 2, state 2),
    # c (load 10, state 12). The fractional knapsack takes a and half of b (3); whole keys
    # need a and b (4) or c (12): 4.
    problem = Problem(keys=np.array(["a", "b", "c", "d"], dtype=object),
                      load=np.array([2.0, 2.0, 10.0, 0.0]), state=np.array([2.0, 2.0, 12.0, 1.0]),
                      current=np.array([0, 0, 0, 1]), default=np.array([0, 0, 0, 1]),
                      n_instances=2)
    assert migration_lower_bound(problem, 11.0) == pytest.approx(3.0)
    assert cover_lower_bound(problem, 11.0) == pytest.approx(4.0, rel=1e-5)
    assert cover_lower_bound(problem, 9.0) == float("inf")


def test_auto_and_milp_report_the_cover_bound_cheap_planners_do_not():
    from rebalance.core.model import PlanParams
    from rebalance.core.planners import get_planner

    problem = Problem(keys=np.array(["a", "b", "c", "d"], dtype=object),
                      load=np.array([2.0, 2.0, 10.0, 0.0]), state=np.array([2.0, 2.0, 12.0, 1.0]),
                      current=np.array([0, 0, 0, 1]), default=np.array([0, 0, 0, 1]),
                      n_instances=2)
    theta = 11.0 / problem.mean_load() - 1  # L_max = 11 (the 10-load key fits)
    for method in ("auto", "milp"):
        plan = get_planner(method).plan(problem, PlanParams(theta=theta, time_limit=5))
        assert plan.metrics.max_load_after <= 11.0 * (1 + 1e-9)
        assert plan.lower_bound_bytes == pytest.approx(4.0, rel=1e-5)
        assert plan.lower_bound_bytes <= plan.metrics.migration_bytes * (1 + 1e-9)
        assert any(n.startswith("lower bound: integer knapsack cover") for n in plan.notes)
    mixed = get_planner("mixed").plan(problem, PlanParams(theta=theta))
    assert mixed.lower_bound_bytes == pytest.approx(
        migration_lower_bound(problem, max(11.0, mixed.metrics.max_load_after)))
