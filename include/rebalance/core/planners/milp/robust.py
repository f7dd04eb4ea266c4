"""Robust MILP: Madsen et al.'s model with one load constraint per instance per scenario.

The ELB/CLB paper's robust view (its m windows) asks every scenario s (a row of
``problem.scenarios``) to keep every active instance within its own bound
B_s = (1 + theta) * mean_s. With normalised loads Y[s, k] = X[s, k] / B_s
(:func:`rebalance.core.planners.robust.normalised`) the model is

    min  sum_k S(k) * (1 - x[k, F(k)])  +  W * e
    s.t. sum_i x[k, i] = 1                           (every key on one instance)
         sum_k Y[s, k] x[k, i] <= 1 + e              (every scenario s, instance i)
         e >= 0,  x binary,  x[k, i] = 0 for drained i

e is the overload of the worst (scenario, instance), weighted above the total state, so
the model first reaches the bound (e = 0) when it can and then migrates least; it is
never infeasible.
"""

from __future__ import annotations

import time

import numpy as np
import pulp

from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.milp.setting import BINARIES_PER_SECOND, MIN_BINARIES
from rebalance.core.planners.milp.solve import _HighsWithStart
from rebalance.core.planners.robust import normalised, robust_llfd


def robust_milp(problem: Problem, params: PlanParams) -> tuple[np.ndarray, list[str]]:
    """The robust MILP's assignment and notes (the model: module docstring).

    Keys with no load in any scenario stay where the start puts them. At most
    ``params.milp_max_keys`` keys (default: the MILP's binaries per second of the time
    limit, over N instances and half the scenarios) are binaries: the heaviest by their
    largest normalised load; the others are fixed where the start (the robust LLFD,
    :func:`rebalance.core.planners.robust.robust_llfd`) puts them, as constants of the
    load rows. HiGHS gets that start, single-threaded with the fixed seed, within the time
    limit; the better of its answer and the start is kept (lower worst peak, then less
    state moved).
    """
    deadline = time.perf_counter() + params.time_limit
    start, start_notes = robust_llfd(problem, params)
    y, _ = normalised(problem, params.theta)
    n, active = problem.n_instances, np.flatnonzero(problem.active)
    peak = y.max(axis=0)
    movable = np.flatnonzero(peak > 0)
    if params.milp_max_keys is not None:
        limit = max(1, int(params.milp_max_keys))
    else:  # the MILP's binaries per second, shared by S load rows per instance
        affordable = max(MIN_BINARIES, int(BINARIES_PER_SECOND * params.time_limit))
        limit = max(1, affordable // (len(active) * max(1, (y.shape[0] + 1) // 2)))
    if len(movable) > limit:
        movable = movable[np.argsort(-peak[movable], kind="stable")[:limit]]
    fixed = np.ones(problem.n_keys, dtype=bool)
    fixed[movable] = False
    const = np.zeros((y.shape[0], n))
    for s in range(y.shape[0]):
        const[s] = np.bincount(start[fixed], weights=y[s, fixed], minlength=n)
    lp = pulp.LpProblem("rebalance_robust_milp", pulp.LpMinimize)
    x = {}
    moved_cost = []
    state_total = float(problem.state.sum()) or 1.0
    for k in movable.tolist():
        row = []
        for i in active.tolist():
            v = x[k, i] = lp.add_variable(f"x_{k}_{i}", cat=pulp.LpBinary)
            row.append((v, 1.0))
            if i != problem.current[k]:
                moved_cost.append((v, float(problem.state[k]) / state_total))
        lp += pulp.LpAffineExpression(row) == 1, f"one_{k}"
    e = lp.add_variable("overload", lowBound=0)
    for s in range(y.shape[0]):
        for i in active.tolist():
            terms = [(x[k, i], float(y[s, k])) for k in movable.tolist() if y[s, k] > 0]
            lp += (pulp.LpAffineExpression([*terms, (e, -1.0)], float(const[s, i])) <= 1.0,
                   f"load_{s}_{i}")
    lp += pulp.LpAffineExpression([*moved_cost, (e, 10.0 * (1 + len(movable)))])
    warm = {x[k, i]: float(start[k] == i) for (k, i) in x}
    solver = _HighsWithStart(warm, deadline - 0.05, params.highs_options, msg=False,
                             threads=1, random_seed=int(params.seed))
    notes = list(start_notes)
    try:
        lp.solve(solver)
        status = lp.solverModel.modelStatusToString(lp.solverModel.getModelStatus())
    except pulp.PulpSolverError as exc:
        notes.append(f"robust MILP: solver error ({exc}); kept the robust LLFD plan")
        return start, notes
    a = start.copy()
    solved = all(v.varValue is not None for v in x.values())
    if solved:
        for (k, i), v in x.items():
            if v.varValue > 0.5:
                a[k] = i
    better = solved and _key(problem, y, a) < _key(problem, y, start)
    notes.append(f"robust MILP over {y.shape[0]} scenario(s): {len(movable)} key(s) as "
                 f"binaries, {int(fixed.sum())} fixed at the robust LLFD plan; HiGHS: {status}; "
                 f"kept {'the MILP' if better else 'the robust LLFD'} plan")
    return (a if better else start), notes


def _key(problem: Problem, y: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    """(worst normalised peak rounded to 1e-9, moved state): smaller is better."""
    n = problem.n_instances
    peak = max(float(np.bincount(a, weights=row, minlength=n).max()) for row in y)
    return (round(max(peak, 1.0), 9), float(problem.state[a != problem.current].sum()))
