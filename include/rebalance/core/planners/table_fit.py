"""Fitting a plan's routing table to A_max by sending keys back to their default instance.

Used by the planners that can leave the table above A_max after their own search:
:mod:`rebalance.core.planners.auto` (after the MILP polish) and :mod:`rebalance.core.planners.milp`
(after disaggregating the reduced model's light keys).
"""

from __future__ import annotations

import numpy as np

from rebalance.core.float_tolerances import LOAD_TOL
from rebalance.core.model import PlanParams, Problem


def fit_table(problem: Problem, params: PlanParams,
              assignment: np.ndarray) -> tuple[np.ndarray, int]:
    """Send routing-table keys back to their default instance: for free, then to fit A_max.

    A key goes back only if its default instance is active and stays within
    L_max = (1 + theta) * mean. First, always, every key the plan moves anyway from one
    table instance to another (current and planned instance both off the default): going
    to its default instead costs no migration and shrinks the table. Then, only while
    the table exceeds A_max: keys the plan moved off their default (going back undoes a
    move), then current table keys the plan leaves in place, by increasing state. Ties by
    lower load first (more of them fit), then key index. Returns the new assignment and
    the number of keys sent back.
    """
    a = np.asarray(assignment, dtype=np.int64).copy()
    table = np.flatnonzero(a != problem.default)
    limit = params.max_table
    excess = len(table) - limit if limit is not None else 0
    if len(table) == 0:
        return a, 0
    active = problem.active
    cur, dft = problem.current[table], problem.default[table]
    rank = np.where(cur != dft, np.where(a[table] != cur, 0, 2), 1)
    cost = np.where(rank == 2, problem.state[table], 0.0)
    order = np.lexsort((table, problem.load[table], cost, rank))
    loads = problem.instance_loads(a)
    l_max = problem.max_load(params.theta) * (1 + LOAD_TOL)
    back = 0
    for k, r in zip(table[order], rank[order]):
        if r > 0 and back >= excess:
            break
        d = problem.default[k]
        c = problem.load[k]
        if not active[d] or loads[d] + c > l_max:
            continue
        loads[a[k]] -= c
        loads[d] += c
        a[k] = d
        back += 1
    return a, back
