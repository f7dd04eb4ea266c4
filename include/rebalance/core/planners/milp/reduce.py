"""Reduction for large inputs: the heaviest keys one by one, the light keys of each
current instance as one fluid reservoir with cost bins refined to a chord error.

Part of :mod:`rebalance.core.planners.milp` (design: ``docs/planning.md``).
"""

from __future__ import annotations

import numpy as np

from rebalance.core.float_tolerances import LOAD_TOL
from rebalance.core.model import Problem
from rebalance.core.planners.milp.setting import (
    BIN_GAP,
    DENSE_BINS,
    FLUID,
    FORCED,
    MAX_BINS,
    PINNED,
    SPARSE_BINS,
    _Reservoir,
    _Setting,
    _Units,
)


def _reduce(problem: Problem, s: _Setting, max_keys: int, theta: float,
            max_returns: int = 0, start: np.ndarray | None = None) -> _Units:
    """Heaviest keys one by one, the rest in one reservoir per current instance.

    With a table bound, light keys now in the routing table (current instance active,
    not draining, default instance active, off their default) get one binary each, up
    to ``max_returns`` of them, cheapest state first: stay, or go back to their default
    instance (which shrinks the table). Only they are taken out of the reservoirs. Keys
    that ``start`` moves elsewhere stay fluid, so the start remains a valid MIP start.
    """
    order = np.argsort(-problem.load, kind="stable")
    explicit, light = np.sort(order[:max_keys]), order[max_keys:]
    if len(light) == 0:
        return _Units(explicit, ())
    loads = np.bincount(problem.current, weights=s.load)
    must = problem.must_move()
    returns = np.empty(0, np.int64)
    if s.max_table is not None and s.budget_keys is None and max_returns > 0:
        active = np.zeros(problem.n_instances + 1, dtype=bool)
        active[s.active] = True
        cand = light[(problem.current[light] != problem.default[light]) & ~must[light]
                     & active[problem.default[light]]]
        if start is not None:
            cand = cand[(start[cand] == problem.current[cand])
                        | (start[cand] == problem.default[cand])]
        cand = cand[np.lexsort((cand, s.cost[cand]))][:max_returns]
        returns = np.sort(cand)
        light = np.setdiff1d(light, returns, assume_unique=True)
        if len(light) == 0:
            return _Units(explicit, (), returns)
    light = light[np.argsort(problem.current[light], kind="stable")]
    sources, starts = np.unique(problem.current[light], return_index=True)
    reservoirs = []
    for j, keys in zip(sources, np.split(light, starts[1:]), strict=True):
        total = float(s.load[keys].sum())
        if must[keys[0]]:
            reservoirs.append(_Reservoir(int(j), FORCED, keys, total))
        elif s.budget_keys is not None:
            reservoirs.append(_Reservoir(int(j), PINNED, keys, total))
        elif total > 0:
            focus = max(float(loads[j]) - s.l_max, 0.0) + theta
            reservoirs.append(_fluid(s, int(j), keys, focus, BIN_GAP / len(sources)))
    return _Units(explicit, tuple(reservoirs), returns)


def _fluid(s: _Setting, source: int, keys: np.ndarray, focus: float,
           max_gap: float) -> _Reservoir:
    """Reservoir of the keys with load on ``source``: bins dense over [0, focus], refined
    until no bin's chord cost exceeds the cheapest-first cost by more than ``max_gap``."""
    keys = keys[s.load[keys] > 0]
    keys = keys[np.lexsort((-s.load[keys], s.cost[keys] / s.load[keys]))]
    load, cost = s.load[keys], s.cost[keys]
    total = float(load.sum())
    points = np.concatenate([np.linspace(0.0, min(total, focus), DENSE_BINS + 1)[1:],
                             total * 0.5 ** np.arange(SPARSE_BINS)])
    ends = np.searchsorted(np.cumsum(load), points * (1 - LOAD_TOL)) + 1
    starts = np.unique(np.concatenate([[0], ends[ends < len(keys)]]))
    starts, gaps = _refine_bins(load, cost, starts, max_gap)
    home = (s.default[keys] == source).astype(np.float64) if s.default is not None \
        else np.zeros(len(keys))
    return _Reservoir(
        source=source, kind=FLUID, keys=keys, load=total,
        bin_load=np.add.reduceat(load, starts), bin_cost=np.add.reduceat(cost, starts),
        chord_gap=float(gaps.max()), bin_home=np.add.reduceat(home, starts),
    )


def _refine_bins(load: np.ndarray, cost: np.ndarray, starts: np.ndarray,
                 max_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Split bins (by load, at their middle) until every chord gap is <= ``max_gap``.

    A bin's chord gap is the largest excess of its average-cost line over the
    cheapest-first cost curve inside it; splitting a bin roughly quarters it.
    """
    cum_load, cum_cost = np.cumsum(load), np.cumsum(cost)
    while True:
        gaps = _chord_gaps(load, cost, cum_load, cum_cost, starts)
        ends = np.append(starts[1:], len(load))
        wide = np.flatnonzero((gaps > max_gap) & (ends - starts > 1))
        if len(wide) == 0 or len(starts) >= MAX_BINS:
            return starts, gaps
        before = np.where(starts[wide] > 0, cum_load[starts[wide] - 1], 0.0)
        middle = np.searchsorted(cum_load, (before + cum_load[ends[wide] - 1]) / 2)
        starts = np.union1d(starts, np.clip(middle, starts[wide] + 1, ends[wide] - 1))


def _chord_gaps(load: np.ndarray, cost: np.ndarray, cum_load: np.ndarray,
                cum_cost: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Chord gap of each bin (see :func:`_refine_bins`)."""
    size = np.diff(np.append(starts, len(load)))
    base_load = np.repeat(np.where(starts > 0, cum_load[starts - 1], 0.0), size)
    base_cost = np.repeat(np.where(starts > 0, cum_cost[starts - 1], 0.0), size)
    slope = np.repeat(np.add.reduceat(cost, starts) / np.add.reduceat(load, starts), size)
    gap = slope * (cum_load - base_load) - (cum_cost - base_cost)
    return np.maximum(np.maximum.reduceat(gap, starts), 0.0)


def _describe_units(problem: Problem, units: _Units, s: _Setting, theta: float) -> str:
    n = int(len(s.active))
    if not units.reduced:
        return f"model: exact, {problem.n_keys} keys x {n} instances as binaries"
    kinds = {kind: sum(len(r.keys) for r in units.reservoirs if r.kind == kind)
             for kind in (FLUID, FORCED, PINNED)}
    light = np.concatenate([units.light, units.returns]).astype(np.int64)
    biggest = float(s.load[light].max()) if len(light) else 0.0
    return (f"model: reduced, {len(units.explicit)} heaviest keys x {n} instances as binaries; "
            f"light keys: {kinds[FLUID]} fluid, {kinds[FORCED]} forced to leave, "
            f"{kinds[PINNED]} pinned, {len(units.returns)} table keys that may go home "
            f"(largest {biggest:.4f} x mean = {biggest / theta:.2f} x theta * mean)")
