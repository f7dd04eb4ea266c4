"""Placing keys heaviest first: the one loop behind every "put it on the least-loaded instance".

* :func:`heaviest_first`: items, heaviest first, each onto the
  candidate instance of lowest level (ties: lower instance index), whose level then grows
  by the item's load: LPT, ELB's placement, the MILP's MIP start and disaggregation.
* :func:`place_forced`: the keys that must move (their instance is drained or removed),
  heaviest first, onto their default instance when asked and it fits, else onto the
  least-loaded active instance: the start of hash, greedy, Flux and the MILP.
"""

from __future__ import annotations

import heapq

import numpy as np

from rebalance.core.float_tolerances import LOAD_TOL
from rebalance.core.model import Problem


def heaviest_first(load: np.ndarray, items: np.ndarray, instances,
                   levels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Place ``items`` heaviest first (ties: their order in ``items``; pass them sorted for
    ties by index), each on the instance of ``instances`` with the lowest level
    (``levels[i]`` to start with; ties: lower instance), which then grows by the item's load.

    Returns the items in placement order, the instance each went to, and the level of
    that instance just before the item was placed (for overflow counts).
    """
    items = np.asarray(items, dtype=np.int64)
    order = items[np.argsort(-load[items], kind="stable")]
    heap = [(float(levels[i]), int(i)) for i in instances]
    heapq.heapify(heap)
    targets = np.empty(len(order), dtype=np.int64)
    before = np.empty(len(order))
    for n, k in enumerate(order.tolist()):
        level, i = heap[0]
        targets[n], before[n] = i, level
        heapq.heapreplace(heap, (level + float(load[k]), i))
    return order, targets, before


def place_forced(problem: Problem, assignment: np.ndarray,
                 max_load: float | None = None) -> tuple[int, int, np.ndarray]:
    """Place the keys that must move, in place: heaviest first (ties: lower key index).

    With ``max_load`` a key goes to its default instance when that is active and stays
    within ``max_load``; otherwise (and always without ``max_load``) to the least-loaded
    active instance (ties: lower index). Returns how many went to their default, how many
    to the least-loaded instance, and the instance loads afterwards (inactive: inf).
    """
    must = problem.must_move()
    forced = np.flatnonzero(must)
    loads = np.bincount(assignment[~must], weights=problem.load[~must],
                        minlength=problem.n_instances)[:problem.n_instances].astype(np.float64)
    active = problem.active
    loads[~active] = np.inf
    to_default = 0
    for k in forced[np.lexsort((forced, -problem.load[forced]))].tolist():
        c, target = float(problem.load[k]), int(problem.default[k])
        if max_load is not None and active[target] \
                and loads[target] + c <= max_load * (1 + LOAD_TOL):
            to_default += 1
        else:
            target = int(np.argmin(loads))
        assignment[k] = target
        loads[target] += c
    return to_default, len(forced) - to_default, loads
