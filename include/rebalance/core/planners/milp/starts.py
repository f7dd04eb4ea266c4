"""The warm start and the MIP starts: the current assignment made valid, a greedy repair
of it, and the model values of the first start that meets the model's constraints.

Part of :mod:`rebalance.core.planners.milp` (design: ``docs/planning.md``).
"""

from __future__ import annotations

import numpy as np
import pulp

from rebalance.core.model import PlanningError, PlanParams, Problem
from rebalance.core.planners.milp.setting import FLUID, PINNED, TOL, _Model, _Setting, _Units
from rebalance.core.planners.packing import heaviest_first, place_forced


def _start_assignment(problem: Problem, params: PlanParams) -> tuple[np.ndarray, str]:
    """The warm start: ``params.warm_start`` or the current assignment made valid."""
    given = params.warm_start
    if given is None:
        start = problem.current.copy()
        _, moved, _ = place_forced(problem, start)
        return start, (
            f"start: current assignment, {moved} key(s) of drained/removed instances placed "
            "largest first on the least-loaded instance")
    start = np.asarray(given, dtype=np.int64)
    if start.shape != (problem.n_keys,):
        raise PlanningError(f"warm_start has shape {start.shape}, expected ({problem.n_keys},)")
    if problem.n_keys and (start.min() < 0 or start.max() >= problem.n_instances
                           or not problem.active[start].all()):
        raise PlanningError("warm_start puts keys outside the active instances")
    return start.copy(), "start: params.warm_start"


def _mip_starts(problem: Problem, s: _Setting, units: _Units,
                start: np.ndarray) -> dict[str, np.ndarray]:
    """Candidate MIP starts, best first: a greedy repair of the start, then the start."""
    return {"greedy repair of the start": _greedy_repair(problem, s, start, _movable(units, s)),
            "the start": start}


def _movable(units: _Units, s: _Setting) -> np.ndarray:
    """Keys whose move the model can express: explicit, fluid (with load) and forced keys."""
    movable = np.zeros(len(s.load), dtype=bool)
    movable[units.explicit] = True
    for res in units.reservoirs:
        movable[res.keys] = res.kind != PINNED
    return movable  # return units (stay or go home) are not: checked apart


def _greedy_repair(problem: Problem, s: _Setting, start: np.ndarray,
                   movable: np.ndarray) -> np.ndarray:
    """A MIP start that usually meets L_max: shed cheap load, place it largest first.

    From each instance above L_max (most loaded first), ``movable`` keys that fit in the
    largest room left on another instance are taken, those lighter than the excess
    first, each group by increasing state per load, until the excess is gone; as many as
    the budgets allow then go, heaviest first, to the instance with the most room.
    """
    a = start.copy()
    room = np.full(problem.n_instances, -np.inf)
    room[s.active] = s.l_max - np.bincount(a, weights=s.load, minlength=problem.n_instances)[
        s.active]
    shed = []
    for i in s.active[np.argsort(room[s.active], kind="stable")]:
        if room[i] >= 0:
            break
        keys = _shed_cheapest(a, s, int(i), -room[i], float(np.delete(room, i).max()),
                              movable)
        room[i] += float(s.load[keys].sum())
        shed.append(keys)
    if not shed:
        return a
    keys = _within_budgets(problem, s, a, np.concatenate(shed))
    a[keys] = -1
    room[s.active] = s.l_max - np.bincount(a[a >= 0], weights=s.load[a >= 0],
                                           minlength=problem.n_instances)[s.active]
    order, targets, _ = heaviest_first(s.load, keys, s.active, -room)
    a[order] = targets
    return a


def _shed_cheapest(a: np.ndarray, s: _Setting, i: int, excess: float, largest_room: float,
                   movable: np.ndarray) -> np.ndarray:
    """Movable keys of instance ``i`` that fit elsewhere and carry ``excess``, cheap first."""
    keys = np.flatnonzero(movable & (a == i) & (s.load > 0) & (s.load <= largest_room))
    keys = keys[np.lexsort((s.cost[keys] / s.load[keys], s.load[keys] > excess))]
    n = int(np.searchsorted(np.cumsum(s.load[keys]), excess, side="left")) + 1
    return keys[:n]


def _within_budgets(problem: Problem, s: _Setting, a: np.ndarray,
                    keys: np.ndarray) -> np.ndarray:
    """The longest prefix of ``keys`` whose moves, added to ``a``'s, fit the budgets."""
    moved = a != problem.current
    fits = np.ones(len(keys), dtype=bool)
    if s.budget_cost is not None:
        fits &= s.cost[moved].sum() + np.cumsum(s.cost[keys]) <= s.budget_cost * (1 + TOL)
    if s.budget_keys is not None:
        fits &= int(moved.sum()) + np.arange(1, len(keys) + 1) <= s.budget_keys
    return keys[:int(np.argmin(fits)) if not fits.all() else len(keys)]


def _start_values(problem: Problem, units: _Units, s: _Setting, m: _Model,
                  starts: dict[str, np.ndarray]) -> tuple[dict | None, str]:
    """Model values of the first start that meets the model's hard constraints."""
    fixed = ~_movable(units, s)
    fixed[units.returns] = False   # checked below: they may only go home
    for name, start in starts.items():
        loads = np.bincount(start, weights=s.load, minlength=problem.n_instances)
        moved = start != problem.current
        if m.hard and loads.max() > s.l_max * (1 + TOL):
            continue
        if s.budget_cost is not None and s.cost[moved].sum() > s.budget_cost * (1 + TOL):
            continue
        if s.budget_keys is not None and int(moved.sum()) > s.budget_keys:
            continue
        if moved[fixed].any():
            continue  # moves the model cannot express
        ret = units.returns
        if len(ret) and (moved[ret] & (start[ret] != problem.default[ret])).any():
            continue  # a return unit can only stay or go back to its default
        return _values(problem, units, s, m, start, loads), (
            f"MIP start: {name} (max load {loads.max():.4f} x mean, "
            f"{s.cost[moved].sum():.4%} of the state moved)")
    return None, "MIP start: none (no start meets the bound and the budgets)"


def _values(problem: Problem, units: _Units, s: _Setting, m: _Model, start: np.ndarray,
            loads: np.ndarray) -> dict[pulp.LpVariable, float]:
    """Values of every model variable for the key assignment ``start``."""
    values = {v: float(start[units.explicit[p]] == i) for (p, i), v in m.x.items()}
    for q, k in enumerate(units.returns):
        values[m.y[q]] = float(start[k] != problem.current[k])
    for r, res in enumerate(units.reservoirs):
        if res.kind == PINNED:
            continue
        out = np.bincount(start[res.keys], weights=s.load[res.keys],
                          minlength=problem.n_instances)
        for i in s.active:
            if i != res.source:
                values[m.z[r, int(i)]] = float(out[i])
        if res.kind == FLUID:
            shed = float(out.sum() - out[res.source])
            before = np.cumsum(res.bin_load) - res.bin_load
            for b, fill in enumerate(np.clip(shed - before, 0.0, res.bin_load)):
                values[m.fill[r, b]] = float(fill)
    for i, e in m.overload.items():
        values[e] = max(0.0, float(loads[i]) - s.l_max)
    if m.worst is not None:
        values[m.worst] = max(0.0, float(loads.max()) - s.l_max)
    if m.table_excess is not None:
        size = m.table_const + sum(c * values.get(v, 0.0) for v, c in m.table_terms)
        values[m.table_excess] = max(0.0, size - float(s.max_table))
    up = float(loads[s.active].max()) - 1.0
    low = 1.0 - float(loads[s.active].min())
    d = max(up, low, 0.0)
    values.update(zip(m.dist, (d, d - up, d - low), strict=True))
    return values
