"""Small problems and brute-force optima shared by the planner unit tests."""

from __future__ import annotations

import itertools

import numpy as np

from rebalance.core.model import Problem


def make_problem(load, state, current, n_instances, drain=(), load_series=None,
                 key_group=None) -> Problem:
    """A problem with keys ``k0, k1, ...`` whose default instance is the current one."""
    current = np.asarray(current, dtype=np.int64)
    return Problem(
        keys=np.array([f"k{i}" for i in range(len(current))], dtype=object),
        load=np.asarray(load, dtype=np.float64),
        state=np.asarray(state, dtype=np.float64),
        current=current,
        default=np.minimum(current, n_instances - 1),
        n_instances=n_instances,
        drain=frozenset(drain),
        load_series=load_series,
        key_group=key_group,
    )


def all_assignments(problem: Problem) -> np.ndarray:
    """Every assignment of the keys to the active instances, one per row."""
    active = np.flatnonzero(problem.active)
    return np.array(list(itertools.product(active, repeat=problem.n_keys)), dtype=np.int64)


def brute_force(problem: Problem, theta: float, budget_bytes: float | None = None,
                budget_keys: int | None = None) -> tuple[float, float, float]:
    """Lexicographic optimum over all assignments within the budgets: (largest load above
    L_max, total load above L_max, migrated bytes); all inf when none meets the budgets."""
    rows = all_assignments(problem)
    moved = rows != problem.current
    migration = moved.astype(float) @ problem.state
    ok = np.ones(len(rows), dtype=bool)
    if budget_bytes is not None:
        ok &= migration <= budget_bytes * (1 + 1e-9)
    if budget_keys is not None:
        ok &= moved.sum(axis=1) <= budget_keys
    if not ok.any():
        return float("inf"), float("inf"), float("inf")
    over = np.clip(np.stack([np.bincount(r, weights=problem.load, minlength=problem.n_instances)
                             for r in rows[ok]]) - problem.max_load(theta), 0, None)
    tol = 1e-9 * problem.mean_load()
    worst, total, migration = over.max(axis=1), over.sum(axis=1), migration[ok]
    best = worst <= worst.min() + tol
    best &= total <= total[best].min() + tol
    return float(worst.min()), float(total[best].min()), float(migration[best].min())


def overload(problem: Problem, assignment: np.ndarray, theta: float) -> tuple[float, float]:
    """Largest and total load above L_max over the instances."""
    loads = problem.instance_loads(assignment)
    over = np.clip(loads - problem.max_load(theta), 0, None)
    return float(over.max()), float(over.sum())


def zipf_problem(n_keys: int, n_instances: int, exponent: float = 0.85, seed: int = 0,
                 n_current: int | None = None, drain=(), windows: int | None = None) -> Problem:
    """Zipf loads over randomly placed keys, state about 100 bytes per unit of load.

    ``n_current`` instances hold the keys now (more than ``n_instances``: scale-in,
    fewer: scale-out). ``windows`` adds a per-window load series around the mean load.
    """
    rng = np.random.default_rng(seed)
    load = rng.permutation(np.arange(1, n_keys + 1, dtype=float) ** -exponent)
    load *= 1e6 / load.sum()
    state = np.round(load * rng.lognormal(0.0, 1.0, n_keys) * 100)
    current = rng.integers(0, n_current or n_instances, n_keys)
    series = None
    if windows:
        series = load * np.clip(1 + 0.3 * rng.standard_normal((windows, n_keys)), 0, None)
    return make_problem(load, state, current, n_instances, drain, load_series=series)
