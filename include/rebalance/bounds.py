"""Lower bounds on the migration any assignment needs to reach a load bound.

Beyond the papers: every plan reports how far it may be from optimal.

The bound relaxes the problem instance by instance. To end with load <= L,
instance d must shed at least ``L_d - L`` of load, and only keys now on d can
leave it. The cheapest way to shed that much, even allowing fractions of
keys, is the fractional knapsack that takes keys by increasing state per unit
of load. Keys on drained or removed instances must all move. Summing over
instances gives a bound no assignment can beat (instances shed disjoint key
sets), and it is exactly the LP relaxation of "each overloaded instance sheds
its excess", computed in O(K log K).
"""

from __future__ import annotations

import numpy as np

from .model import Problem


def migration_lower_bound(problem: Problem, max_load: float) -> float:
    """Least state (bytes) any assignment must move so every instance load <= ``max_load``.

    Returns ``inf`` when no assignment can reach ``max_load`` because a single
    key is heavier than it.
    """
    if problem.n_keys == 0:
        return 0.0
    if float(problem.load.max()) > max_load * (1 + 1e-12):
        return float("inf")
    forced = problem.must_move()
    bound = float(problem.state[forced].sum())
    stay = ~forced
    cur = problem.current[stay]
    load = problem.load[stay]
    state = problem.state[stay]
    loads = np.bincount(cur, weights=load, minlength=problem.n_instances)
    over = np.flatnonzero(loads > max_load * (1 + 1e-12))
    if len(over) == 0:
        return bound
    # Sort once by (instance, state per unit load); free keys (no state) first.
    with np.errstate(divide="ignore", invalid="ignore"):
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
